"""Durations written the way Go and Kubernetes write them (`500ms`, `2s`, `5m`, `1h30m`).

The grammar is Go's `time.ParseDuration`: an optional sign, then one or more decimal numbers
each followed by a unit (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`), summed. One extension: a bare
number is seconds, because the chart and older configurations pass plain numbers. Like Go, a
duration must fit in a signed 64-bit count of nanoseconds (about 292 years).
"""

from __future__ import annotations

import re

NANOSECONDS_PER_UNIT = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign, as Go accepts
    "\u03bcs": 1_000,  # Greek small letter mu, as Go accepts
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
UNITS = "ns, us (or µs), ms, s, m or h"
EXAMPLES = "500ms, 2s or 5m"

_LONGEST_NS = 2**63 - 1  # Go's time.Duration is an int64 of nanoseconds
# an exponent of at most three digits keeps the exact arithmetic below cheap for any input
_BARE_SECONDS = re.compile(r"[+-]?(?P<whole>[0-9]*)(?:\.(?P<fraction>[0-9]*))?(?:[eE](?P<exponent>[+-]?[0-9]{1,3}))?")
# far more digits than any duration has, and few enough for int() (Python limits it to 4300)
_MAX_DIGITS = 1200
# one number and the unit after it; as in Go, the unit is everything up to the next digit or dot
_TERM = re.compile(r"(?P<whole>[0-9]*)(?:\.(?P<fraction>[0-9]*))?(?P<unit>[^0-9.]*)")


class DurationError(ValueError):
    pass


def parse_duration(text: str) -> float:
    """Seconds in `text`: a Go duration (`1h30m`, `-1.5s`, `300us`) or a bare number of seconds.

    Surrounding whitespace is ignored (an environment variable may end in a newline)."""
    s = text.strip()
    negative = s.startswith("-")
    bare = _BARE_SECONDS.fullmatch(s)
    if bare and (bare["whole"] or bare["fraction"]):
        digits, scale = _decimal(bare["whole"], bare["fraction"], text)
        scale -= int(bare["exponent"] or "0")
        return _seconds(_whole_nanoseconds(digits, scale, NANOSECONDS_PER_UNIT["s"]), negative, text)
    body = s[1:] if s[:1] in ("-", "+") else s
    if not body:
        raise DurationError(f"expected a duration like {EXAMPLES}, got {text!r}")
    nanoseconds = 0
    position = 0
    while position < len(body):
        term = _TERM.match(body, position)
        assert term is not None  # every part of the pattern may be empty, so it always matches
        whole, fraction, unit = term["whole"], term["fraction"], term["unit"]
        if not whole and not fraction:
            raise DurationError(f"expected a duration like {EXAMPLES}, got {text!r}")
        if not unit:
            raise DurationError(f"missing unit after {term.group()!r} in {text!r}: use {UNITS}")
        if unit not in NANOSECONDS_PER_UNIT:
            raise DurationError(f"unknown unit {unit!r} in {text!r}: use {UNITS}")
        # whole nanoseconds per term, as Go counts them
        nanoseconds += _whole_nanoseconds(*_decimal(whole, fraction, text), NANOSECONDS_PER_UNIT[unit])
        position = term.end()
    return _seconds(nanoseconds, negative, text)


def _decimal(whole: str, fraction: str | None, text: str) -> tuple[int, int]:
    """The number `whole.fraction` as digits / 10**scale, exactly (no float, and no Fraction: that
    imports decimal, half a megabyte in every service for a few flags)."""
    whole = whole.lstrip("0")
    if len(whole) > _MAX_DIGITS:
        raise _too_long(text)
    fraction = (fraction or "")[:_MAX_DIGITS]  # digits that far down change nothing
    return int(whole + fraction or "0"), len(fraction)


def _whole_nanoseconds(digits: int, scale: int, per_unit: int) -> int:
    """digits / 10**scale units in whole nanoseconds, the rest dropped as Go drops it."""
    power: int = 10 ** abs(scale)
    return digits * per_unit * power if scale <= 0 else digits * per_unit // power


def _seconds(nanoseconds: int, negative: bool, text: str) -> float:
    if nanoseconds > (_LONGEST_NS + 1 if negative else _LONGEST_NS):  # int64 holds one more below zero
        raise _too_long(text)
    return (-nanoseconds if negative else nanoseconds) / NANOSECONDS_PER_UNIT["s"]


def _too_long(text: str) -> DurationError:
    return DurationError(f"{text!r} is longer than the longest duration, about 292 years")
