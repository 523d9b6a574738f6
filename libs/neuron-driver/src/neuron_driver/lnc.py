"""The logical NeuronCore (LNC) setting: how many physical cores make one logical core.

Precedence: the `NEURON_LOGICAL_NC_CONFIG` environment variable (what the runtime itself
honours), then `/opt/aws/neuron/logical_nc_config`, then the family default (2 on trn2,
1 elsewhere). A value the family does not support is reported and the default used.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from neuron_driver import layout
from neuron_driver.attrs import read_text
from neuron_driver.errors import IssueKind, ScanIssue, SysfsError
from neuron_driver.parse import parse_lnc
from neuron_model.instance_types import Family


class LncSource(enum.StrEnum):
    ENV = "env"
    FILE = "file"
    DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class LncSetting:
    value: int
    source: LncSource


def resolve_lnc(root: Path, family: Family | None, env: Mapping[str, str]) -> tuple[LncSetting, list[ScanIssue]]:
    issues: list[ScanIssue] = []
    default = family.default_lnc if family else 1
    supported = family.supported_lnc if family else (1, 2)

    candidates: list[tuple[LncSource, str, str]] = []
    if layout.LNC_ENV in env:
        candidates.append((LncSource.ENV, env[layout.LNC_ENV], f"${layout.LNC_ENV}"))
    path = layout.HostLayout(root).lnc_config
    try:
        candidates.append((LncSource.FILE, read_text(path), str(path)))
    except SysfsError as exc:
        if exc.issue.kind is not IssueKind.MISSING:  # absent is normal: the default applies
            issues.append(exc.issue)

    for source, text, where in candidates:
        try:
            value = parse_lnc(text)
        except ValueError as exc:
            issues.append(ScanIssue(IssueKind.INVALID_CONFIG, where, str(exc)))
            continue
        if value not in supported:
            name = family.name if family else "this device"
            issues.append(
                ScanIssue(
                    IssueKind.INVALID_CONFIG,
                    where,
                    f"logical NeuronCore config {value} is not supported on {name} "
                    f"(supported: {', '.join(map(str, supported))}); using {default}",
                )
            )
            continue
        return LncSetting(value, source), issues
    return LncSetting(default, LncSource.DEFAULT), issues
