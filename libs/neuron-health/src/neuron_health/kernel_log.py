"""Follow the kernel log: the real `/dev/kmsg`, or a file such as a simulated node's `dev/kmsg`.

`/dev/kmsg` returns one record per `read()` and `EPIPE` when records were overwritten before
we read them; a file holds one record per line and may be truncated (a new boot in the
simulator). Both are followed from the end, with an optional look-back at start that
replays the records logged within the last `lookback` seconds (by their boot-time stamp).
Garbage is yielded as `Malformed` so callers can count it; it never stops the follower.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from neuron_common.lifecycle import sleep_or_stop, wait_any
from neuron_driver.kmsg import KmsgRecord, parse_record, split_records

log = logging.getLogger(__name__)

_READ_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class Malformed:
    text: str
    error: str


def boot_time_usec() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1000


class KmsgFollower:
    def __init__(self, path: str, *, lookback: float | None = 0.0, poll_interval: float = 0.1) -> None:
        """`lookback`: seconds of history to replay at start; None replays the whole log."""
        self.path = path
        self.lookback = lookback
        self.poll_interval = poll_interval

    def _cutoff(self) -> int | None:
        if self.lookback is None:
            return None
        return boot_time_usec() - int(self.lookback * 1_000_000)

    def _parse(self, text: str, cutoff: int | None) -> KmsgRecord | Malformed | None:
        try:
            record = parse_record(text)
        except ValueError as exc:
            return Malformed(text[:200], str(exc))
        if cutoff is not None and record.usec < cutoff:
            return None
        return record

    async def follow(self, stop: asyncio.Event) -> AsyncIterator[KmsgRecord | Malformed]:
        st = os.stat(self.path)  # a clear FileNotFoundError/PermissionError for the caller
        if stat.S_ISCHR(st.st_mode):
            async for item in self._follow_device(stop):
                yield item
        else:
            async for item in self._follow_file(stop):
                yield item

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
        cutoff = self._cutoff()
        offset = 0
        inode = None
        tail = ""
        first = True
        while not stop.is_set():
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                await self._sleep(stop)
                continue
            if inode is not None and (st.st_ino != inode or st.st_size < offset):
                log.info("kernel log file was replaced or truncated: reading it from the start")
                offset, tail = 0, ""
                cutoff = None
            if first and self.lookback == 0:
                offset = st.st_size  # follow from the current end
                cutoff = None
            first = False
            inode = st.st_ino
            if st.st_size <= offset:
                await self._sleep(stop)
                continue
            with open(self.path, "rb") as f:  # noqa: ASYNC230 - a local file; reads are small and bounded
                f.seek(offset)
                while not stop.is_set():
                    chunk = f.read(_READ_CHUNK)
                    if not chunk:
                        break
                    offset += len(chunk)
                    records, tail = split_records(tail + chunk.decode("utf-8", "replace"))
                    for text in records:
                        item = self._parse(text, cutoff)
                        if item is not None:
                            yield item
                    await asyncio.sleep(0)  # a flood must not starve the rest of the service
            cutoff = None  # the look-back applies to the history present at start only

    async def _sleep(self, stop: asyncio.Event) -> None:
        await sleep_or_stop(stop, self.poll_interval)
