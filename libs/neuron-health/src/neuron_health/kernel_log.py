"""Follow the kernel log: the real `/dev/kmsg`, a file such as a simulated node's `dev/kmsg`, or a
syslog text file the host's syslog daemon writes (`/var/log/kern.log`, `/var/log/messages`).

Two formats (`KERNEL_LOG_FORMATS`), chosen by the caller, not guessed: a regular file can hold
either (the simulated node's `dev/kmsg` is a file in kmsg format), and an empty one says nothing.

- ``kmsg``: `/dev/kmsg` returns one record per `read()` and `EPIPE` when records were overwritten
  before we read them; a file holds one record per line and may be truncated (a new boot in the
  simulator).
- ``syslog``: one line per message (`neuron_driver.syslog`); other programs' lines are skipped.
  The file is rotated by the host: renamed and replaced (what is still written to the old file is
  read before the new one), or copied and truncated (read again from its start). Lines get a
  `seq` that grows through the boot (`syslog_seq`), so a restarted reader can skip what it handled.

Both are followed from the end, with an optional look-back at start that replays the records
logged within the last `lookback` seconds: by their boot-time stamp for kmsg, by the daemon's wall
clock stamp for syslog, never before this boot began (a syslog file spans boots; an old boot's
error must not count against this one). Garbage is yielded as `Malformed` so callers can count
it; it never stops the follower.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import errno
import logging
import os
import stat
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from neuron_common.lifecycle import sleep_or_stop, wait_any
from neuron_driver.kmsg import KmsgRecord, parse_record, split_records
from neuron_driver.syslog import parse_syslog_line

log = logging.getLogger(__name__)

_READ_CHUNK = 64 * 1024  # at least 4, the longest UTF-8 character, or a read could hold no whole one
KERNEL_LOG_FORMATS = ("kmsg", "syslog")


# A syslog stamp has whole seconds (traditional form) and the daemon may stamp this boot's first
# lines a little before the boot time computed now (clock steps at boot): this boot begins this
# long before that. A reboot takes longer, so the last lines of the boot before stay out.
BOOT_SLACK = 5.0


@dataclass(frozen=True, slots=True)
class Malformed:
    text: str
    error: str


def boot_time_usec() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1000


def boot_wall_time() -> float:
    """When this boot began, on the wall clock (seconds since the epoch)."""
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)


def syslog_seq(usec: int, repeat: int) -> int:
    """The sequence number of a syslog line: its boot-time stamp, then its place among the lines
    with the same stamp (a traditional stamp has whole seconds; at most 1,000 are told apart)."""
    return usec * 1000 + min(repeat, 999)


def host_timezone(host_root: Path) -> dt.tzinfo | None:
    """The host's zone (`<host-root>/etc/localtime`), in which a traditional syslog stamp is written;
    None (this process's zone) when it cannot be read."""
    try:
        with open(host_root / "etc" / "localtime", "rb") as f:
            return ZoneInfo.from_file(f)
    except (OSError, ValueError, ZoneInfoNotFoundError):
        return None


class KmsgFollower:
    def __init__(
        self,
        path: str,
        *,
        lookback: float | None = 0.0,
        poll_interval: float = 0.1,
        format: str = "kmsg",
        tz: dt.tzinfo | None = None,
    ) -> None:
        """`lookback`: seconds of history to replay at start; None replays the whole log (of this
        boot). `format`: one of `KERNEL_LOG_FORMATS`. `tz`: the zone of a syslog file's stamps
        without offset (None: this process's)."""
        if format not in KERNEL_LOG_FORMATS:
            raise ValueError(f"kernel log format must be one of {', '.join(KERNEL_LOG_FORMATS)}, not {format!r}")
        self.path = path
        self.lookback = lookback
        self.poll_interval = poll_interval
        self.format = format
        self.tz = tz
        # Whole seconds: a syslog line's sequence number is its time since this boot, and must come
        # out the same in a restarted reader, while time.time() - CLOCK_BOOTTIME differs by some
        # microseconds between two processes (a line with a whole-second stamp was then numbered
        # after the last one handled, and reported again).
        self._boot = float(int(boot_wall_time()))
        self._last_usec = -1
        self._repeat = 0
        self._last_seq = -1

    def _cutoff(self) -> float | None:
        """Records older than this are history not replayed: kmsg, boot-time microseconds; syslog,
        wall-clock seconds."""
        if self.format == "syslog":
            begin = self._boot - BOOT_SLACK
            # whole seconds: a traditional stamp is truncated to its second
            return begin if self.lookback is None else max(begin, float(int(time.time() - self.lookback)))
        if self.lookback is None:
            return None
        return boot_time_usec() - int(self.lookback * 1_000_000)

    def _parse(self, text: str, cutoff: float | None) -> KmsgRecord | Malformed | None:
        if self.format == "syslog":
            return self._parse_syslog(text, cutoff)
        try:
            record = parse_record(text)
        except ValueError as exc:
            return Malformed(text[:200], str(exc))
        if cutoff is not None and record.usec < cutoff:
            return None
        return record

    def _parse_syslog(self, text: str, cutoff: float | None) -> KmsgRecord | Malformed | None:
        try:
            record = parse_syslog_line(text, now=time.time(), tz=self.tz, boot=self._boot)
        except ValueError as exc:
            return Malformed(text[:200], str(exc))
        if record is None:
            return None
        if cutoff is not None and record.wall is not None and record.wall < cutoff:
            return None
        self._repeat = self._repeat + 1 if record.usec == self._last_usec else 0
        self._last_usec = record.usec
        # Never below the line before: a reader skips a number at or below the last it handled, and
        # a later line's stamp can be earlier (two CPUs' printk clocks, the wall clock stepped back
        # on a host whose lines have no printk time). A restarted reader numbers such a line lower
        # again, so it skips it as handled, which it was.
        self._last_seq = max(syslog_seq(record.usec, self._repeat), self._last_seq + 1)
        return replace(record, seq=self._last_seq)

    async def follow(self, stop: asyncio.Event) -> AsyncIterator[KmsgRecord | Malformed]:
        st = os.stat(self.path)  # a clear FileNotFoundError/PermissionError for the caller
        if stat.S_ISCHR(st.st_mode) and self.format == "kmsg":
            async for item in self._follow_device(stop):
                yield item
        elif stat.S_ISREG(st.st_mode) or self.format == "kmsg":
            async for item in self._follow_file(stop):
                yield item
        else:
            raise OSError(
                errno.EINVAL, "a syslog kernel log must be a regular file, such as /var/log/kern.log", self.path
            )

    async def _follow_device(self, stop: asyncio.Event) -> AsyncIterator[KmsgRecord | Malformed]:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        cutoff = self._cutoff()
        if self.lookback == 0:
            os.lseek(fd, 0, os.SEEK_END)
            cutoff = None
        readable = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(fd, readable.set)
        try:
            while not stop.is_set():
                try:
                    raw = os.read(fd, 8192)
                except BlockingIOError:
                    readable.clear()
                    await wait_any(stop, readable)
                    continue
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # the ring buffer overtook us: records lost
                        log.warning("kernel log records were overwritten before they were read")
                        continue
                    raise
                item = self._parse(raw.decode("utf-8", "replace").rstrip("\n"), cutoff)
                if item is not None:
                    yield item
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    async def _follow_file(self, stop: asyncio.Event) -> AsyncIterator[KmsgRecord | Malformed]:
        """A regular file, followed through replacement (rotation by rename, a simulated node's new
        boot) and truncation (copytruncate). The open file is kept: when the path names another file,
        the old one is read on until the new one has a line (the writer has moved over), then to its
        end, and only then the new one from its start, so no line is lost, read twice or out of order."""
        cutoff = self._cutoff()
        split = _split_lines if self.format == "syslog" else split_records
        f = None
        ident: tuple[int, int] | None = None
        tail = ""
        head = b""  # the file's first bytes: a file truncated and written past where we were starts otherwise
        first = True
        try:
            while not stop.is_set():
                if f is None:
                    try:
                        f = open(self.path, "rb")  # noqa: ASYNC230, SIM115 - a local file, kept open across polls
                    except FileNotFoundError:
                        first = False  # a file that appears later is all new
                        await self._sleep(stop)
                        continue
                    st = os.fstat(f.fileno())
                    ident, tail, head = (st.st_dev, st.st_ino), "", b""
                    if first and self.lookback == 0:
                        f.seek(0, os.SEEK_END)  # follow from the current end
                        cutoff = None
                    first = False
                if os.fstat(f.fileno()).st_size < f.tell() or _rewritten(f, head):
                    log.info("kernel log file %s was truncated: reading it from its start", self.path)
                    f.seek(0)
                    tail, head = "", b""
                async for item in self._read_on(f, split, tail, cutoff, stop):
                    if isinstance(item, str):
                        tail = item
                    else:
                        yield item
                cutoff = None  # the look-back applies to the history present at start only
                try:
                    now = os.stat(self.path)
                except FileNotFoundError:
                    now = None  # renamed away, its successor not there yet: the old one may still grow
                if now is not None and (now.st_dev, now.st_ino) != ident:
                    if now.st_size == 0:
                        # logrotate's `create` makes the new file before the daemon is told to reopen: until
                        # the daemon writes there, it may still write to the old one
                        await self._sleep(stop)
                        continue
                    async for item in self._read_on(f, split, tail, None, stop):  # what came since
                        if isinstance(item, str):
                            tail = item
                        else:
                            yield item
                    last = self._parse(tail, None) if tail.strip() and self.format == "syslog" else None
                    if last is not None:  # an unfinished last line: all there will be of it
                        yield last
                    log.info("kernel log file %s was replaced: reading the new one from its start", self.path)
                    f.close()
                    f, tail = None, ""
                    continue
                head = _head(f, head)
                await self._sleep(stop)
        finally:
            if f is not None:
                f.close()

    async def _read_on(
        self,
        f: IO[bytes],
        split: Callable[[str], tuple[list[str], str]],
        tail: str,
        cutoff: float | None,
        stop: asyncio.Event,
    ) -> AsyncIterator[KmsgRecord | Malformed | str]:
        """Records from `f`'s position to its end; the unfinished tail comes last, as a str."""
        while not stop.is_set():
            chunk = f.read(_READ_CHUNK)
            if not chunk:
                break
            whole = _whole_characters(chunk)
            if whole < len(chunk):  # a character cut in two by the read or the writer: read again with its rest
                f.seek(whole - len(chunk), os.SEEK_CUR)
                chunk = chunk[:whole]
                if not chunk:
                    break
            records, tail = split(tail + chunk.decode("utf-8", "replace"))
            for text in records:
                item = self._parse(text, cutoff)
                if item is not None:
                    yield item
            await asyncio.sleep(0)  # a flood must not starve the rest of the service
        yield tail

    async def _sleep(self, stop: asyncio.Event) -> None:
        await sleep_or_stop(stop, self.poll_interval)


def _whole_characters(data: bytes) -> int:
    """How many of `data`'s bytes end on a UTF-8 character's boundary: a character whose first bytes
    end `data` is left for the next read, which has the rest."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the character's first byte: it says how long the character is
            length = 2 if 0xC0 <= byte < 0xE0 else 3 if 0xE0 <= byte < 0xF0 else 4 if 0xF0 <= byte < 0xF8 else 1
            return len(data) - back if length > back else len(data)
    return len(data)  # no first byte among the last four: not UTF-8, decoded as it is


def _split_lines(chunk: str) -> tuple[list[str], str]:
    lines = chunk.split("\n")
    tail = lines.pop()
    return lines, tail


_HEAD_BYTES = 256


def _head(f: IO[bytes], known: bytes) -> bytes:
    """The file's first bytes, read again only while fewer than `_HEAD_BYTES` are known."""
    if len(known) >= _HEAD_BYTES:
        return known
    return os.pread(f.fileno(), _HEAD_BYTES, 0)


def _rewritten(f: IO[bytes], head: bytes) -> bool:
    """copytruncate, then more written than we had read, before we looked: the size alone does not
    show it, the first bytes do (a log only ever grows at its end)."""
    return bool(head) and os.pread(f.fileno(), len(head), 0) != head
