"""Kernel records in a syslog text file (neuron_driver.syslog)."""

from __future__ import annotations

import contextlib
import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_driver.kmsg import KERN_ERR, KERN_INFO, format_hw_error, parse_hw_error
from neuron_driver.syslog import parse_syslog_line

UTC = dt.UTC
NOW = dt.datetime(2026, 11, 27, 0, 0, 0, tzinfo=UTC).timestamp()
HW = format_hw_error("SRAM_UNCORRECTABLE_ERROR", 3, 1, "5c3f2f3a0e6a1d2b")


def at(*args: int) -> float:
    return dt.datetime(*args, tzinfo=UTC).timestamp()  # type: ignore[misc]


@pytest.mark.parametrize(
    ("line", "wall", "usec", "priority"),
    [
        # rsyslog's traditional file format (Ubuntu's kern.log, Amazon Linux 2's messages)
        (f"Nov 26 23:56:24 ip-10-0-0-1 kernel: [ 1234.567890] {HW}", at(2026, 11, 26, 23, 56, 24), 1234567890, KERN_INFO),
        (f"Nov  6 01:02:03 ip-10-0-0-1 kernel: [    5.000001] {HW}", at(2026, 11, 6, 1, 2, 3), 5000001, KERN_INFO),
        # without the printk time (printk.time=0): usec from the stamp and the boot
        (f"Nov 26 23:56:24 ip-10-0-0-1 kernel: {HW}", at(2026, 11, 26, 23, 56, 24), 24_000_000, KERN_INFO),
        # rsyslog's high-precision FileFormat (Debian 12), and a forwarded line with its <PRI>
        (f"2026-11-26T23:56:24.123456+00:00 ip-10-0-0-1 kernel: [   12.5] {HW}", at(2026, 11, 26, 23, 56, 24) + 0.123456, 12_500_000, KERN_INFO),
        (f"<3>2026-11-26T23:56:24Z ip-10-0-0-1 kernel: {HW}", at(2026, 11, 26, 23, 56, 24), 24_000_000, KERN_ERR),
        # RFC 5424 (RSYSLOG_SyslogProtocol23Format): app, procid, msgid, structured data
        (f"<3>1 2026-11-26T23:56:24.5Z ip-10-0-0-1 kernel - - - [ 7.000000] {HW}", at(2026, 11, 26, 23, 56, 24) + 0.5, 7_000_000, KERN_ERR),
        (f'<3>1 2026-11-26T23:56:24Z ip-10-0-0-1 kernel - - [meta x="a\\]b"] {HW}', at(2026, 11, 26, 23, 56, 24), 24_000_000, KERN_ERR),
        # a kernel tag with a pid, and rsyslog's folded repeats
        (f"Nov 26 23:56:24 ip-10-0-0-1 kernel[0]: {HW}", at(2026, 11, 26, 23, 56, 24), 24_000_000, KERN_INFO),
        (f"Nov 26 23:56:24 ip-10-0-0-1 kernel: message repeated 3 times: [ [ 1.000000] {HW}]", at(2026, 11, 26, 23, 56, 24), 1_000_000, KERN_INFO),
    ],
)  # fmt: skip
def test_kernel_lines(line: str, wall: float, usec: int, priority: int) -> None:
    boot = at(2026, 11, 26, 23, 56, 0)
    record = parse_syslog_line(line, now=NOW, tz=UTC, boot=boot)
    assert record is not None
    assert (record.message, record.wall, record.usec, record.priority) == (HW, pytest.approx(wall), usec, priority)
    hw = parse_hw_error(record.message)
    assert hw is not None
    assert (hw.kind, hw.device, hw.core) == ("SRAM_UNCORRECTABLE_ERROR", 3, 1)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "   ",
        "Nov 26 23:56:24 ip-10-0-0-1 systemd[1]: Started Session 3 of User ec2-user.",
        'Nov 26 23:56:24 ip-10-0-0-1 rsyslogd: [origin software="rsyslogd"] start',
        "2026-11-26T23:56:24+00:00 ip-10-0-0-1 kubelet[812]: kernel: [ 1.0] a kubelet line quoting one",
        "<3>1 2026-11-26T23:56:24Z ip-10-0-0-1 containerd 812 - - kernel: not the kernel's",
        "Nov 26 23:56:24 ip-10-0-0-1 text without a tag",
    ],
)
def test_other_programs_lines_are_skipped(line: str) -> None:
    assert parse_syslog_line(line, now=NOW) is None


@pytest.mark.parametrize(
    "line",
    [
        "garbage",
        "\x00\x01\x02",
        "Foo 26 23:56:24 ip kernel: x",
        "Feb 30 00:00:00 ip kernel: x",
        "2026-13-45T99:00:00Z ip kernel: x",
        "<999>2026-11-26T23:56:24Z ip kernel: x",
        "Nov 26 23:56:24",
    ],
)
def test_garbage_is_an_error(line: str) -> None:
    with pytest.raises(ValueError, match="syslog"):
        parse_syslog_line(line, now=NOW)


PLUS2 = dt.timezone(dt.timedelta(hours=2))


@pytest.mark.parametrize(
    ("line", "now", "tz", "wall"),
    [
        # a traditional stamp takes the latest year not in the future
        ("Dec 31 23:59:00 ip kernel: x", at(2027, 1, 1, 0, 10, 0), UTC, at(2026, 12, 31, 23, 59, 0)),
        ("Jan  1 00:09:00 ip kernel: x", at(2027, 1, 1, 0, 10, 0), UTC, at(2027, 1, 1, 0, 9, 0)),
        # and is read in the host's zone
        ("Nov 26 12:00:00 ip kernel: x", NOW, PLUS2, at(2026, 11, 26, 10, 0, 0)),
        # an ISO stamp says its own offset, whatever the zone
        ("2026-11-26T12:00:00+02:00 ip kernel: x", NOW, UTC, at(2026, 11, 26, 10, 0, 0)),
    ],
)
def test_a_stamp_is_read_as_the_time_it_means(line: str, now: float, tz: dt.tzinfo, wall: float) -> None:
    record = parse_syslog_line(line, now=now, tz=tz)
    assert record is not None
    assert record.wall == wall


@given(st.text(max_size=300))
def test_any_text_is_a_record_none_or_a_value_error(text: str) -> None:
    with contextlib.suppress(ValueError):
        parse_syslog_line(text, now=NOW, boot=NOW - 100)


messages = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=200).filter(
    lambda m: not m.startswith(("[", "message repeated"))
)


@given(st.integers(0, 10**7), st.integers(0, 999_999), messages, st.sampled_from(["trad", "iso", "5424"]))
def test_message_and_printk_time_survive(sec: int, usec: int, message: str, form: str) -> None:
    body = f"[{sec:>5}.{usec:06d}] {message}"
    line = {
        "trad": f"Nov 26 23:56:24 ip-10-0-0-1 kernel: {body}",
        "iso": f"2026-11-26T23:56:24.000001+00:00 ip-10-0-0-1 kernel: {body}",
        "5424": f"<4>1 2026-11-26T23:56:24Z ip-10-0-0-1 kernel - - - {body}",
    }[form]
    record = parse_syslog_line(line, now=NOW, tz=UTC)
    assert record is not None
    assert (record.message, record.usec) == (message, sec * 1_000_000 + usec)
