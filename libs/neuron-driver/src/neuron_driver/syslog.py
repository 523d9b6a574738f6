"""Kernel records in a syslog text file: what rsyslog writes to /var/log/kern.log (Ubuntu, Debian)
or /var/log/messages (Amazon Linux 2, RHEL), read without the privilege `/dev/kmsg` takes.

Each line is one message; the kernel's are the ones tagged ``kernel``. Recognised forms::

    Nov 26 23:56:24 ip-10-0-0-1 kernel: [ 1234.567890] text          traditional (RFC 3164 time)
    2026-11-26T23:56:24.123456+00:00 ip-10-0-0-1 kernel: [ 1234.567890] text   rsyslog's FileFormat
    <3>1 2026-11-26T23:56:24.123456Z ip-10-0-0-1 kernel - - - [ 1234.567890] text   RFC 5424

each with or without the bracketed printk time (``printk.time=0`` leaves it out) and with an
optional leading ``<PRI>``. A line is parsed into the `KmsgRecord` a `/dev/kmsg` record becomes:
its `message` is the kernel's text, `usec` the printk time (or, without one, the stamp's distance
from `boot`), `wall` the stamp; `seq` is 0 (the file has none: `neuron_health.kernel_log`
numbers the lines it follows), and the level is the ``<PRI>``'s or, as a plain file does not say
it, `KERN_INFO`.

`parse_syslog_line` returns None for a line of another program (or a blank one) and raises
ValueError for a line it cannot read, which the follower counts as malformed.
"""

from __future__ import annotations

import datetime as dt
import re

from neuron_driver.kmsg import KERN_INFO, KmsgRecord

_MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), start=1)}  # noqa: SIM905

_HEAD = re.compile(
    r"(?:<(?P<pri>\d{1,3})>(?P<version>1 )?)?"
    r"(?:(?P<mon>[A-Z][a-z]{2}) (?P<day>[ \d]?\d) (?P<hms>\d\d:\d\d:\d\d)"
    r"|(?P<iso>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?))"
    r" +(?P<host>\S+) (?P<rest>.*)",
    re.DOTALL,
)
# "kernel: text" or "kernel[0]: text" (a 3164 tag); "kernel - - - text" (5424: app, procid, msgid, data)
_TAG = re.compile(r"(?P<tag>[^\s:\[\]]+)(?:\[[^\]\s]*\])?:(?: (?P<msg>.*))?$", re.DOTALL)
_5424 = re.compile(r"(?P<tag>\S+) (?:\S+) (?:\S+) (?:-|(?:\[(?:[^\]\\]|\\.)*\])+)(?: (?P<msg>.*))?$", re.DOTALL)
_PRINTK = re.compile(r"\[ *(?P<sec>\d+)\.(?P<frac>\d{1,9})\] ?(?P<msg>.*)$", re.DOTALL)
# rsyslog's RepeatedMsgReduction folds repeats into one line that quotes the message
_REPEATED = re.compile(r"message repeated \d+ times: \[ ?(?P<msg>.*)\]$", re.DOTALL)


def parse_syslog_line(
    text: str, *, now: float, tz: dt.tzinfo | None = None, boot: float | None = None
) -> KmsgRecord | None:
    """One line (without its newline). `now`: the present (seconds since the epoch), which gives a
    traditional stamp its year; `tz`: the zone the syslog daemon wrote a stamp without offset in
    (None: this process's local zone); `boot`: when this boot began, for `usec` without a printk time."""
    line = text.rstrip("\r\n")
    if not line.strip():
        return None
    head = _HEAD.match(line)
    if head is None:
        raise ValueError(f"not a syslog line (no time stamp and host): {line[:60]!r}")
    wall = _stamp(head, now, tz)
    rest = head.group("rest")
    form = _5424.match(rest) if head.group("version") else None
    form = form or _TAG.match(rest)
    if form is None or form.group("tag") != "kernel":
        return None  # another program's message
    message = form.group("msg") or ""
    repeated = _REPEATED.match(message)
    if repeated is not None:
        message = repeated.group("msg")
    printk = _PRINTK.match(message)
    if printk is not None:
        usec = int(printk.group("sec")) * 1_000_000 + int(printk.group("frac")[:6].ljust(6, "0"))
        message = printk.group("msg")
    else:
        usec = max(0, round((wall - boot) * 1_000_000)) if boot is not None else 0
    priority, facility = KERN_INFO, 0
    if head.group("pri") is not None:
        pri = int(head.group("pri"))
        if pri > 191:
            raise ValueError(f"syslog priority {pri} is out of range (0..191): {line[:60]!r}")
        priority, facility = pri & 7, pri >> 3
    return KmsgRecord(priority=priority, facility=facility, seq=0, usec=usec, flags="-", message=message, wall=wall)


def _stamp(head: re.Match[str], now: float, tz: dt.tzinfo | None) -> float:
    iso = head.group("iso")
    try:
        if iso is not None:
            stamp = dt.datetime.fromisoformat(iso)
            if stamp.tzinfo is None:
                stamp = stamp.replace(tzinfo=tz) if tz is not None else stamp
            return stamp.timestamp()
        month = _MONTHS.get(head.group("mon"))
        if month is None:
            raise ValueError(f"unknown month {head.group('mon')!r}")
        h, m, s = (int(x) for x in head.group("hms").split(":"))
        day = int(head.group("day"))
        # a traditional stamp has no year: the latest year that does not put it in the future
        # (a day's grace for clocks and zones)
        year = dt.datetime.fromtimestamp(now, tz).year
        for candidate in (year + 1, year, year - 1, year - 2, year - 3, year - 4):
            try:
                when = dt.datetime(candidate, month, day, h, m, s, tzinfo=tz).timestamp()
            except ValueError:  # 29 Feb of a year without one, or out of range
                continue
            if when <= now + 86_400:
                return when
        raise ValueError(f"no year puts {head.group('mon')} {day} in the past")
    except (ValueError, OverflowError, OSError) as exc:
        raise ValueError(f"bad syslog time stamp in {head.group(0)[:60]!r}: {exc}") from None
