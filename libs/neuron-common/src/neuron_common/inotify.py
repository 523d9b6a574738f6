"""Wake up when a directory's entries change (Linux inotify, through libc), instead of polling.

Used to notice the kubelet deleting plugin sockets and recreating `kubelet.sock`. When
inotify is not available (another OS, no libc symbol, the directory does not exist yet),
`DirectoryWatch.wait` degrades to a timed poll, so callers always stay correct.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_ATTRIB = 0x4
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_MASK = IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB


def _libc() -> ctypes.CDLL | None:
    # glibc's soname first: find_library runs `ldconfig -p` in a subprocess, needed only elsewhere
    for name in ("libc.so.6", None):
        try:
            libc = ctypes.CDLL(name or ctypes.util.find_library("c"), use_errno=True)
            libc.inotify_init1  # noqa: B018 - probe for the symbol
        except (OSError, AttributeError, TypeError):
            continue
        return libc
    return None


class DirectoryWatch:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._libc = _libc()
        self._fd: int | None = None
        self._changed = asyncio.Event()

    def _ensure(self) -> bool:
        if self._fd is not None:
            return True
        if self._libc is None or not self.directory.is_dir():
            return False
        fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            return False
        if self._libc.inotify_add_watch(fd, os.fsencode(self.directory), _MASK) < 0:
            os.close(fd)
            return False
        self._fd = fd
        asyncio.get_running_loop().add_reader(fd, self._readable)
        return True

    def _readable(self) -> None:
        assert self._fd is not None
        gone = False
        try:
            while True:
                data = os.read(self._fd, 64 * 1024)
                if not data:
                    break
                offset = 0
                while offset + 16 <= len(data):  # struct inotify_event: wd, mask, cookie, len, name
                    mask = int.from_bytes(data[offset + 4 : offset + 8], "little")
                    length = int.from_bytes(data[offset + 12 : offset + 16], "little")
                    gone = gone or bool(mask & (IN_DELETE_SELF | IN_MOVE_SELF))
                    offset += 16 + length
        except BlockingIOError:
            pass
        if gone:  # the directory itself went away: watch it again once it is back
            self.close()
        self._changed.set()

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109 - the timeout is the fallback poll
        """Until something in the directory changes, or `timeout`; True when a change was seen."""
        watching = self._ensure()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout if watching else min(timeout, 0.2))
        except TimeoutError:
            return not watching  # without inotify every poll counts as a possible change
        self._changed.clear()
        return True

    def close(self) -> None:
        if self._fd is not None:
            asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None
