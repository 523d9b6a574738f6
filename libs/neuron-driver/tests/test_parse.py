from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_driver.parse import (
    parse_connected_devices,
    parse_core_count,
    parse_int,
    parse_lnc,
    parse_power_utilization,
    parse_serial_number,
)

GARBAGE: list[tuple[Callable[[str], object], str, str]] = [
    *(
        (parse_int, text, "expected an integer")
        for text in ["", "\n", "abc", "1.5", "0x10", "1 2", "--1", "1e3", "\x00", "\u0663", "\u00b2"]
    ),
    *(
        (parse_connected_devices, text, "list of device indices")
        for text in ["1, x", "1;2", "1,,2", "-1", "1, 2, ", "1, \u0663", "\u00b2"]  # other scripts' digits
    ),
]


@pytest.mark.parametrize(("parse", "text", "error"), GARBAGE, ids=[f"{p.__name__}:{t!r}" for p, t, _ in GARBAGE])
def test_garbage_is_rejected_saying_what_was_expected(parse: Callable[[str], object], text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse(text)


def test_core_count_has_no_trailing_newline_and_must_be_positive() -> None:
    assert parse_core_count("8") == 8
    with pytest.raises(ValueError, match="positive"):
        parse_core_count("0")


@given(st.lists(st.integers(min_value=0, max_value=127), max_size=16))
def test_connected_devices_in_driver_format(devices: list[int]) -> None:
    text = ", ".join(map(str, devices)) + "\n"
    assert parse_connected_devices(text) == tuple(devices)


def test_lnc_only_one_or_two() -> None:
    assert parse_lnc("2\n") == 2
    with pytest.raises(ValueError, match="1 or 2"):
        parse_lnc("4\n")


def test_serial_number_formats() -> None:
    assert parse_serial_number("19fcda00f5ff6eb9\n") == "19fcda00f5ff6eb9"
    assert parse_serial_number("\n") is None  # the driver writes nothing when the read failed
    with pytest.raises(ValueError, match="16 hex"):
        parse_serial_number("XYZ\n")


def test_power_utilization() -> None:
    reading = parse_power_utilization("0,1700000000,12,80,41\n")
    assert (reading.status, reading.min_power, reading.max_power, reading.avg_power) == (0, 12, 80, 41)
    assert reading.valid
    assert not parse_power_utilization("1,0,0,0,0").valid
    with pytest.raises(ValueError, match="<status>"):
        parse_power_utilization("0,1,2\n")
