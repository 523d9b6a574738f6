"""The kernel log record format (`/dev/kmsg`) and the Neuron runtime's `NEURON_HW_ERR` lines.

A `/dev/kmsg` record is ``prio,seq,usec,flags[,...];message`` followed by optional
continuation lines that start with a space (``" KEY=value"``, the record's dictionary).
The real device returns one record per ``read()``; a file (the simulated node's
``dev/kmsg``) holds one record per line. `split_records` handles both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from neuron_driver.parse import decimal

T = TypeVar("T")

KERN_ERR = 3
KERN_INFO = 6


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    priority: int  # syslog level (0..7)
    facility: int
    seq: int
    usec: int  # microseconds since boot
    flags: str
    message: str
    fields: dict[str, str] = field(default_factory=dict)
    # The time a syslog daemon stamped on the line (seconds since the epoch), for a record read from a
    # syslog text file (neuron_driver.syslog); None for a /dev/kmsg record, whose time is `usec`.
    wall: float | None = None


def parse_record(text: str) -> KmsgRecord:
    """One record, with or without its continuation lines. Raises ValueError on garbage."""
    head, _, rest = text.partition("\n")
    prefix, sep, message = head.partition(";")
    if not sep:
        raise ValueError(f"no ';' between header and message in {head[:60]!r}")
    parts = prefix.split(",")
    if len(parts) < 4:
        raise ValueError(f"expected 'prio,seq,usec,flags;' header, found {prefix[:60]!r}")
    try:
        prio_fac, seq, usec = int(parts[0]), int(parts[1]), int(parts[2])
    except ValueError:
        raise ValueError(f"non-numeric kmsg header {prefix[:60]!r}") from None
    if prio_fac < 0 or seq < 0 or usec < 0:
        raise ValueError(f"negative value in kmsg header {prefix[:60]!r}")
    fields: dict[str, str] = {}
    for line in rest.split("\n"):
        if line.startswith(" ") and "=" in line:
            key, _, value = line[1:].partition("=")
            fields[key] = value
    return KmsgRecord(
        priority=prio_fac & 7,
        facility=prio_fac >> 3,
        seq=seq,
        usec=usec,
        flags=parts[3],
        message=_unescape(message),
        fields=fields,
    )


def _unescape(message: str) -> str:
    """The text behind the kernel's \\xNN escapes. The kernel escapes each byte of a multi-byte
    UTF-8 character on its own, so a run of escapes is decoded as one byte string: "caf\\xc3\\xa9"
    reads "café", not "cafÃ©". A byte that is not UTF-8 reads as its escape."""
    if "\\x" not in message:
        return message
    return _ESCAPE_RUN.sub(_decode_run, message)


_ESCAPE_RUN = re.compile(r"(?:\\x[0-9a-fA-F]{2})+")


def _decode_run(run: re.Match[str]) -> str:
    return bytes.fromhex(run.group().replace("\\x", "")).decode("utf-8", "backslashreplace")


def format_record(priority: int, seq: int, usec: int, message: str, facility: int = 0) -> str:
    """One record as a line of the simulated node's kmsg file (newline included), escaped as the
    kernel escapes /dev/kmsg's text: a control character, DEL, the backslash itself and each byte
    of a non-ASCII character as \\xNN, so that a message holding the text `\\x00` reads back as
    that text, not as a NUL (printk's msg_add_ext_text: `c < ' ' || c >= 127 || c == '\\\\'`)."""
    raw = message.replace("\n", " ").encode("utf-8", "surrogateescape")
    clean = "".join(chr(b) if 32 <= b < 127 and b != 0x5C else f"\\x{b:02x}" for b in raw)
    return f"{(facility << 3) | priority},{seq},{usec},-;{clean}\n"


def split_records(chunk: str) -> tuple[list[str], str]:
    """Split buffered text into complete records and the unfinished tail.

    Continuation lines (leading space) stay with their record. A record is complete once
    the next header line has started, or, for the last one, once its newline has arrived
    and no continuation can follow in this chunk: a file writer appends whole records, so a
    trailing newline ends the record.
    """
    records: list[str] = []
    current: list[str] = []
    lines = chunk.split("\n")
    tail = lines.pop()  # text after the last newline: unfinished
    for line in lines:
        if line.startswith(" ") and current:
            current.append(line)
            continue
        if current:
            records.append("\n".join(current))
        current = [line]
    if current:
        records.append("\n".join(current))
    return records, tail


@dataclass(frozen=True, slots=True)
class HwError:
    """A `NEURON_HW_ERR=<KIND> key=value ...` line written by the Neuron runtime."""

    kind: str
    device: int | None
    core: int | None
    serial: str | None
    action: str | None
    attributes: dict[str, str]


_HW_ERR_RE = re.compile(r"NEURON_HW_ERR=([A-Z0-9_]+)")
_KV_RE = re.compile(r"([A-Za-z][A-Za-z0-9_-]*)=(\S*)")


def parse_hw_error(message: str) -> HwError | None:
    match = _HW_ERR_RE.search(message)
    if match is None:
        return None
    attributes = dict(_KV_RE.findall(message[match.end() :]))

    def as_int(key: str) -> int | None:
        value = attributes.get(key)
        return None if value is None else decimal(value)

    return HwError(
        kind=match.group(1),
        device=as_int("nd-id"),
        core=as_int("nc-id"),
        serial=attributes.get("serial-num") or None,
        action=attributes.get("action") or None,
        attributes=attributes,
    )


def locate(message: str, match: re.Match[str]) -> tuple[int | None, int | None, str | None]:
    """Device, core and serial a matched kernel line names: from its `nd-id=`/`nc-id=`/`serial-num=`
    when it is a NEURON_HW_ERR line, else the device from the pattern's `device` group."""
    hw = parse_hw_error(message)
    device = hw.device if hw else None
    if device is None and "device" in match.groupdict():
        value = match.group("device")
        device = None if value is None else decimal(value)
    return device, (hw.core if hw else None), (hw.serial if hw else None)


def search(
    patterns: Iterable[tuple[T, re.Pattern[str]]], message: str
) -> Iterator[tuple[T, int | None, int | None, str | None]]:
    """Each (key, pattern) whose pattern a kernel message holds, with the device, core and serial the
    line names: the one matcher behind the fault table's kernel rules and the detector's rules file."""
    for key, pattern in patterns:
        match = pattern.search(message)
        if match is not None:
            yield (key, *locate(message, match))


def format_hw_error(
    kind: str,
    device: int,
    core: int,
    serial: str,
    action: str = "TERMINATE_INSTANCE",
    instance_id: str = "i-0123456789abcdef0",
    hostname: str = "ip-10-0-0-1",
) -> str:
    """The runtime's line, as in `neuron-runtime/nrt-troubleshoot.rst`."""
    return (
        f"NEURON_HW_ERR={kind} instance-id={instance_id} hostname={hostname} "
        f"nd-id={device} nc-id={core} serial-num={serial} action={action}"
    )
