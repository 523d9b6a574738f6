"""Reading single attributes, and logging each distinct problem once.

Sysfs attributes are tiny; `os.open`/`os.read` skips the buffered-file machinery that
costs more than the read itself when a scrape touches thousands of them.
"""

from __future__ import annotations

import errno
import logging
import os
from collections import OrderedDict
from pathlib import Path

from neuron_driver.errors import IssueKind, ScanIssue, SysfsError

log = logging.getLogger("neuron_driver")

_MAX_ATTR_BYTES = 4096  # one page: the kernel never returns more from a sysfs show()


def read_bytes(path: str | bytes | Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, _MAX_ATTR_BYTES)
    finally:
        os.close(fd)


def issue_for_oserror(path: str | Path, exc: OSError) -> ScanIssue:
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return ScanIssue(IssueKind.MISSING, str(path), "does not exist")
    return ScanIssue(IssueKind.UNREADABLE, str(path), f"cannot be read: {exc.strerror or exc}")


def read_text(path: Path) -> str:
    """The attribute's text, or `SysfsError` saying whether it is missing, unreadable or binary."""
    try:
        raw = read_bytes(path)
    except OSError as exc:
        raise SysfsError(issue_for_oserror(path, exc)) from None
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise SysfsError(ScanIssue(IssueKind.MALFORMED, str(path), f"holds non-text bytes {raw[:20]!r}")) from None


class IssueLog:
    """Logs each distinct issue once per process, so a scan every few seconds over a broken
    attribute gives one warning, not one a scan. Bounded: the oldest are forgotten first."""

    def __init__(self, limit: int = 4096) -> None:
        self._seen: OrderedDict[ScanIssue, None] = OrderedDict()
        self._limit = limit

    def report(self, issue: ScanIssue) -> None:
        if issue in self._seen:
            self._seen.move_to_end(issue)
            return
        self._seen[issue] = None
        if len(self._seen) > self._limit:
            self._seen.popitem(last=False)
        log.warning(
            "sysfs %s: %s: %s",
            issue.kind,
            issue.path,
            issue.message,
            extra={"issue_kind": str(issue.kind), "path": issue.path},
        )


ISSUE_LOG = IssueLog()
