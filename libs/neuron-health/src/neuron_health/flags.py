"""The flags of the health sources, as config groups (`neuron_common.config`): the kernel log, which
every service that reads it takes, and the device-health sources of the plugin and the DRA driver."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_common.config import Host, flag, optional_path, positive_duration
from neuron_driver.layout import HostLayout
from neuron_health.kernel_log import KERNEL_LOG_FORMATS
from neuron_health.pipeline import HEARTBEAT_STALE_AFTER


@dataclass(frozen=True, kw_only=True)
class KernelLogFormat(Host):
    kernel_log_format: str = flag(
        "kmsg",
        "'kmsg': --kmsg-path is /dev/kmsg, or a file of its records (a simulated node); reading the host's "
        "/dev/kmsg takes CAP_SYSLOG and, in a container, privilege. 'syslog': --kmsg-path is a text file the "
        "host's syslog daemon writes (/var/log/kern.log on Ubuntu and Debian, /var/log/messages on Amazon "
        "Linux 2 and RHEL under <host-root>), read as an ordinary file and followed through log rotation",
        choices=KERNEL_LOG_FORMATS,
    )


@dataclass(frozen=True, kw_only=True)
class KernelLog(KernelLogFormat):
    """The kernel log of a service that always follows it; '' is the host's (from the host layout)."""

    kmsg_path: Path = flag("", "kernel log to follow; default <host-root>/dev/kmsg")

    @classmethod
    def resolve(cls, p: argparse.ArgumentParser, v: dict[str, Any], environ: Mapping[str, str]) -> None:
        v["kmsg_path"] = kernel_log_path(p, v)


@dataclass(frozen=True, kw_only=True)
class Heartbeat:
    """When the firmware's heartbeat is stale, for every agent that watches the counters: the same value
    on all of them, or the plugin could advertise a device the detector has faulted (the chart sets one)."""

    heartbeat_stale_after: float = flag(
        f"{HEARTBEAT_STALE_AFTER:g}s",
        "how long a device's healthcheck_heartbeat (driver 2.30.2 and later, trn2 and trn3) may stand still, once "
        "seen to change, before it is the fault HEALTHCHECK_HEARTBEAT_STALE",
        type=positive_duration,
    )


@dataclass(frozen=True, kw_only=True)
class HealthSources(Heartbeat, KernelLogFormat):
    """The device-health sources of the plugin and the DRA driver: counters, the kernel log, verdicts."""

    kmsg_path: Path | None = flag(
        "", "kernel log to watch for NEURON_HW_ERR lines; default <host-root>/dev/kmsg; 'none' disables"
    )
    health_interval: float = flag(
        "500ms", "time between reads of the error counters and device presence", type=positive_duration
    )
    health_quiet_period: float = flag(
        "5m",
        "time without a new error before a device with a recoverable error is healthy again",
        type=positive_duration,
    )
    verdict_dir: Path | None = flag(
        "",
        "directory of per-device verdicts from neuron-problem-detector (a device it marks unhealthy is "
        "taken out of service); '' disables",
        type=optional_path,
    )

    @classmethod
    def resolve(cls, p: argparse.ArgumentParser, v: dict[str, Any], environ: Mapping[str, str]) -> None:
        v["kmsg_path"] = None if v["kmsg_path"] == "none" else kernel_log_path(p, v)
        if v["health_quiet_period"] < v["health_interval"]:
            p.error("--health-quiet-period must be at least --health-interval")


def kernel_log_path(p: argparse.ArgumentParser, v: Mapping[str, Any]) -> Path:
    """--kmsg-path as given, or the host's kernel log (from the host layout) for ''; stops at start
    when --kernel-log-format does not fit it (`check_kernel_log`)."""
    given, fmt = v["kmsg_path"], v["kernel_log_format"]
    check_kernel_log(p, given, fmt)
    return Path(given) if given else HostLayout(v["host_root"]).kmsg


def check_kernel_log(p: argparse.ArgumentParser, kmsg_path: str, fmt: str) -> None:
    """Stop at start when --kernel-log-format=syslog has no file to read: it has no default (hosts
    keep it under different names, and some have none), and /dev/kmsg or a directory is not one. A
    file that is not there yet is waited for (rotation can leave the path empty for a moment)."""
    if fmt != "syslog":
        return
    if not kmsg_path:
        p.error(
            "--kernel-log-format=syslog needs --kmsg-path naming the host's syslog file of kernel messages, "
            "e.g. <host-root>/var/log/kern.log (Ubuntu, Debian) or <host-root>/var/log/messages (Amazon Linux 2)"
        )
    path = Path(kmsg_path)
    if path.is_char_device():
        p.error(
            f"--kmsg-path {kmsg_path} is a character device (/dev/kmsg): --kernel-log-format=syslog reads a "
            "syslog text file; use --kernel-log-format=kmsg for the device"
        )
    if path.is_dir():
        p.error(f"--kmsg-path {kmsg_path} is a directory: --kernel-log-format=syslog reads one syslog text file")
