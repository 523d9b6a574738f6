"""Typed problems met while reading the driver's sysfs.

A scan never raises these for one bad attribute: it records them as `ScanIssue`s and
carries on, so one broken file costs one value, not the whole node.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class IssueKind(enum.StrEnum):
    MISSING = "missing"  # the attribute or directory does not exist
    UNREADABLE = "unreadable"  # it exists but reading failed (permissions, EIO)
    MALFORMED = "malformed"  # it was read but does not hold the driver's format
    VANISHED = "vanished"  # the device directory went away while we were scanning it
    MISMATCH = "mismatch"  # two sources disagree (connected_devices vs the instance table)
    INVALID_CONFIG = "invalid_config"  # a setting (logical-core config) holds a bad value


@dataclass(frozen=True, slots=True)
class ScanIssue:
    kind: IssueKind
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.path}: {self.message}"


class SysfsError(Exception):
    """Raised by the single-value readers; carries the issue it describes."""

    def __init__(self, issue: ScanIssue) -> None:
        super().__init__(str(issue))
        self.issue = issue
