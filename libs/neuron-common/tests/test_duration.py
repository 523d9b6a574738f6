"""Durations as Go's time.ParseDuration reads them, plus bare numbers as seconds.

The accepted and rejected tables were checked against Go's own ParseDuration."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_common.duration import NANOSECONDS_PER_UNIT, DurationError, parse_duration

LONGEST_NS = 2**63 - 1


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2s", 2.0),
        ("500ms", 0.5),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        ("1.5h", 5400.0),
        ("300us", 0.0003),
        ("300µs", 0.0003),  # micro sign
        ("300μs", 0.0003),  # Greek mu
        ("10ns", 1e-8),
        ("1m1m", 120.0),  # terms add up, in any order, as in Go
        ("1s1h", 3601.0),
        (".5s", 0.5),
        ("1.s", 1.0),
        ("+5s", 5.0),
        ("-1.5s", -1.5),
        ("0", 0.0),
        ("-0", 0.0),
        ("0s", 0.0),
        ("0.5ns", 0.0),  # whole nanoseconds, as Go counts them
        ("2562047h47m16.854775807s", LONGEST_NS / 10**9),  # Go's longest duration
        ("9223372036854775807ns", LONGEST_NS / 10**9),
        ("-9223372036854775808ns", -(2**63) / 10**9),
        # bare numbers are seconds: the chart and older configurations pass them
        ("1", 1.0),
        ("0.5", 0.5),
        ("300", 300.0),
        ("1e3", 1000.0),  # what Helm renders a large number as
        ("-2", -2.0),
        (" 3s\n", 3.0),  # an environment variable may end in a newline
    ],
)
def test_accepted(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected a duration like 500ms, 2s or 5m, got ''"),
        ("abc", "expected a duration like 500ms, 2s or 5m, got 'abc'"),
        ("s", "expected a duration like"),
        (".s", "expected a duration like"),
        (".", "expected a duration like"),
        ("-", "expected a duration like"),
        ("--1s", "expected a duration like"),
        ("inf", "expected a duration like"),
        ("nan", "expected a duration like"),
        ("1x", "unknown unit 'x' in '1x': use ns, us (or µs), ms, s, m or h"),
        ("1S", "unknown unit 'S'"),  # units are case-sensitive: M could be read as months
        ("1d", "unknown unit 'd'"),  # Go has no days either
        ("1s-1s", "unknown unit 's-'"),
        ("1h 30m", "unknown unit 'h '"),
        ("1_000s", "unknown unit '_'"),
        ("1s2", "missing unit after '2' in '1s2'"),
        ("9223372036854775808ns", "longer than the longest duration"),
        ("2562048h", "longer than the longest duration"),
        ("-9223372036854775809ns", "longer than the longest duration"),
        ("1e300", "longer than the longest duration"),
        ("9" * 5000 + "s", "longer than the longest duration"),  # past Python's int() digit limit
    ],
)
def test_rejected(text: str, message: str) -> None:
    with pytest.raises(DurationError) as err:
        parse_duration(text)
    assert message in str(err.value)


def go_format(nanoseconds: int) -> str:
    """Every unit spelt out, so the string exercises each one."""
    parts = []
    for unit in ("h", "m", "s", "ms", "us", "ns"):
        count, nanoseconds = divmod(nanoseconds, NANOSECONDS_PER_UNIT[unit])
        parts.append(f"{count}{unit}")
    return "".join(parts)


whole_nanoseconds = st.integers(min_value=0, max_value=LONGEST_NS)
# Expected seconds are `nanoseconds / 10**9`, never `/ 1e9`: int / int is rounded once, while above 2**53
# int / float first rounds the nanoseconds to a float, and a quarter of int64 values then differ in the last bit.


def test_expectations_are_rounded_once() -> None:
    nanoseconds = 7_093_357_934_545_455_493
    assert nanoseconds / 10**9 != nanoseconds / 1e9  # the case that once made these properties flaky
    assert parse_duration(f"{nanoseconds}ns") == nanoseconds / 10**9


@given(whole_nanoseconds)
def test_every_duration_written_in_units_reads_back(nanoseconds: int) -> None:
    assert parse_duration(go_format(nanoseconds)) == nanoseconds / 10**9


@given(whole_nanoseconds)
def test_bare_seconds_with_nanosecond_digits_read_back(nanoseconds: int) -> None:
    seconds, rest = divmod(nanoseconds, 10**9)
    assert parse_duration(f"{seconds}.{rest:09d}") == nanoseconds / 10**9


@given(whole_nanoseconds)
def test_a_minus_sign_negates(nanoseconds: int) -> None:
    text = go_format(nanoseconds)
    assert parse_duration("-" + text) == -parse_duration(text)


units = st.sampled_from(sorted(NANOSECONDS_PER_UNIT))
amounts = st.integers(min_value=0, max_value=10**6)


@given(st.lists(st.tuples(amounts, units), min_size=1, max_size=6))
def test_terms_add_up(terms: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{u}" for n, u in terms)
    total = sum(n * NANOSECONDS_PER_UNIT[u] for n, u in terms)
    if total > 2**63 - 1:  # six terms of a million hours pass Go's int64 of nanoseconds: refused, as Go does
        with pytest.raises(DurationError, match="longer than the longest duration"):
            parse_duration(text)
        return
    assert math.isclose(parse_duration(text), total / 1e9, rel_tol=1e-15)


@given(amounts, st.text(alphabet=st.characters(categories=("L",)), min_size=1, max_size=3))
def test_only_the_six_units_are_units(amount: int, unit: str) -> None:
    if unit in NANOSECONDS_PER_UNIT:
        assert parse_duration(f"{amount}{unit}") == amount * NANOSECONDS_PER_UNIT[unit] / 10**9
    else:
        with pytest.raises(DurationError, match="unknown unit"):
            parse_duration(f"{amount}{unit}")


@given(st.text(alphabet=st.characters(exclude_categories=("Nd",)), max_size=8))
def test_text_without_a_digit_is_never_a_duration(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)


@given(st.text(max_size=20))
def test_any_text_is_a_duration_or_a_duration_error(text: str) -> None:
    try:
        seconds = parse_duration(text)
    except DurationError:
        return
    assert abs(seconds) <= (LONGEST_NS + 1) / 1e9


_digits = st.text(alphabet="0123456789", max_size=25)


@given(_digits, _digits, st.sampled_from(sorted(NANOSECONDS_PER_UNIT)), st.integers(-30, 30))
def test_decimals_count_the_whole_nanoseconds_exactly(whole: str, fraction: str, unit: str, exponent: int) -> None:
    """Against exact rational arithmetic: a term is its whole nanoseconds, the rest dropped (as Go
    does), and bare seconds with an exponent likewise."""
    if not whole and not fraction:
        return
    value = Fraction(int(whole or "0")) + (Fraction(int(fraction), 10 ** len(fraction)) if fraction else 0)
    for text, nanoseconds in (
        (f"{whole}.{fraction}{unit}", int(value * NANOSECONDS_PER_UNIT[unit])),
        (f"{whole}.{fraction}e{exponent}", int(value * Fraction(10) ** exponent * NANOSECONDS_PER_UNIT["s"])),
    ):
        if nanoseconds > 2**63 - 1:
            with pytest.raises(DurationError, match="longest duration"):
                parse_duration(text)
        else:
            assert parse_duration(text) == nanoseconds / NANOSECONDS_PER_UNIT["s"], text
