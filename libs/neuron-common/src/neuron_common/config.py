"""Command-line flags, each with an environment-variable twin, validated at start.

Precedence: flag, then environment variable, then default. `--help` names the variable and
the default; a bad value from either source stops the service with a message that says
which source it came from. Durations are written as in Kubernetes (`500ms`, `2s`, `5m`) or as
bare seconds (see `neuron_common.duration`).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from neuron_common.duration import DurationError, parse_duration

DURATION_HELP = "A DURATION is written as in Go and Kubernetes, e.g. 500ms, 2s, 5m or 1h30m; a bare number is seconds."


class EnvArgumentParser(argparse.ArgumentParser):
    def __init__(self, *args: Any, env_prefix: str, env: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)
        self.env_prefix = env_prefix
        self.env = os.environ if env is None else env
        self._from_env: dict[str, str] = {}

    def env_name(self, flag: str) -> str:
        return self.env_prefix + flag.lstrip("-").replace("-", "_").upper()

    def add_flag(
        self,
        flag: str,
        *,
        default: Any,
        help: str,
        type: Callable[[str], Any] = str,
        choices: Any = None,
        env_name: str | None = None,
    ) -> None:
        """A flag whose default comes from its environment variable when that is set."""
        name = env_name or self.env_name(flag)
        dest = flag.lstrip("-").replace("-", "_")
        if name in self.env:
            raw = self.env[name]
            try:
                value = type(raw)
            except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
                self.error(f"environment variable {name}={raw!r} is invalid for {flag}: {exc}")
            if choices is not None and value not in choices:
                self.error(f"environment variable {name}={raw!r} must be one of {', '.join(map(str, choices))}")
            default = value
            self._from_env[dest] = name
        metavar = None
        if type in (positive_duration, non_negative_duration):
            metavar = "DURATION"
            self.epilog = DURATION_HELP
        self.add_argument(
            flag, default=default, type=type, choices=choices, metavar=metavar, help=f"{help} [env {name}]"
        )

    def add_bool_flag(self, flag: str, *, default: bool, help: str) -> None:
        name = self.env_name(flag)
        if name in self.env:
            raw = self.env[name].strip().lower()
            if raw not in ("1", "0", "true", "false", "yes", "no"):
                self.error(f"environment variable {name}={self.env[name]!r} must be true or false")
            default = raw in ("1", "true", "yes")
        self.add_argument(flag, default=default, action=argparse.BooleanOptionalAction, help=f"{help} [env {name}]")


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_duration(text: str) -> float:
    """Seconds in a duration that must be longer than zero."""
    value = _duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text!r}")
    return value


def non_negative_duration(text: str) -> float:
    """Seconds in a duration that may be zero."""
    value = _duration(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text!r}")
    return value


def listen_address(text: str) -> tuple[str, int]:
    """`host:port` (IPv6 as `[::1]:port`); port 0 picks a free one."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected host:port (e.g. 0.0.0.0:9100), got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def log_level(text: str) -> str:
    value = text.lower()
    if value not in ("debug", "info", "warning", "error"):
        raise argparse.ArgumentTypeError(f"must be debug, info, warning or error, got {text!r}")
    return value


def require_resource_prefix(parser: argparse.ArgumentParser, prefix: str) -> None:
    """Stop at start, naming the flag, when `--resource-prefix` cannot prefix an extended resource."""
    from neuron_model import resources

    if not resources.is_valid_prefix(prefix):
        parser.error(f"--resource-prefix {prefix!r} is not a valid DNS subdomain outside kubernetes.io")


# A Node's name is a DNS subdomain (RFC 1123).
NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def require_node_name(parser: argparse.ArgumentParser, name: str) -> None:
    """Stop at start, naming the flag, when `--node-name` cannot be a Node's name."""
    if len(name) > 253 or not NODE_NAME.fullmatch(name):
        parser.error(f"--node-name {name!r} is not a node name (a lowercase DNS subdomain)")


def parse_flags(
    parser: Callable[[Mapping[str, str] | None], EnvArgumentParser],
    argv: Sequence[str] | None,
    env: Mapping[str, str] | None,
) -> tuple[EnvArgumentParser, argparse.Namespace, Mapping[str, str]]:
    """The start of every service's `parse`: its parser (to stop at start, naming the flag), the
    parsed flags, and the environment the fallbacks such as $NODE_NAME are read from."""
    p = parser(env)
    return p, p.parse_args(argv), os.environ if env is None else env


# Flag groups: what several services take, declared once. Each service composes the groups it
# needs, then adds its own flags; the resolvers below turn a group's raw values into the config's.


def add_serving_flags(
    p: EnvArgumentParser, default_listen: str, what: str = "/healthz, /readyz, /metrics", *, tls: bool = True
) -> None:
    """--listen, --log-level and the /metrics protection (`tls=False`: the service has its own TLS flags)."""
    p.add_flag("--listen", default=default_listen, type=listen_address, help=f"address of {what}")
    p.add_flag("--log-level", default="info", type=log_level, help="debug, info, warning or error")
    add_metrics_auth_flags(p, tls=tls)


METRICS_AUTH = ("none", "kubernetes")


@dataclass(frozen=True)
class MetricsSecurity:
    """--metrics-auth=kubernetes: /metrics over TLS, served only to callers the API server vouches
    for (neuron_common.metrics_auth). The certificate and key are the service's serving pair."""

    cert: str
    key: str


def add_metrics_auth_flags(p: EnvArgumentParser, *, tls: bool = True) -> None:
    """--metrics-auth, and the serving certificate it needs (`tls=False`: the service has its own)."""
    p.add_flag(
        "--metrics-auth",
        default="none",
        choices=METRICS_AUTH,
        help="'kubernetes': serve over TLS and answer /metrics only to a bearer token the API server authenticates "
        "(TokenReview) whose user may get the non-resource path /metrics (SubjectAccessReview); /healthz and "
        "/readyz stay open to the kubelet's probes. 'none': plain HTTP, /metrics open to whoever reaches the port",
    )
    if tls:
        p.add_flag("--tls-cert-file", default="", help="serving certificate (PEM), needed by --metrics-auth=kubernetes")
        p.add_flag("--tls-key-file", default="", help="private key of --tls-cert-file (PEM)")


def resolve_metrics_security(
    p: argparse.ArgumentParser, metrics_auth: str, cert: str, key: str
) -> MetricsSecurity | None:
    """Stops at start when authentication is asked for without TLS: a bearer token must not cross
    the network in clear, nor a certificate be half given."""
    if (cert or key) and not (cert and key):
        p.error("--tls-cert-file and --tls-key-file go together: pass both or neither")
    if metrics_auth == "none":
        return None
    if not cert:
        p.error("--metrics-auth=kubernetes needs --tls-cert-file and --tls-key-file: callers send bearer tokens")
    require_files(p, ("--tls-cert-file", cert), ("--tls-key-file", key))
    return MetricsSecurity(cert, key)


class Serving(TypedDict):
    """The config's fields from `add_serving_flags` (with the service's own TLS pair)."""

    listen: tuple[str, int]
    log_level: str
    metrics_security: MetricsSecurity | None


def resolve_serving(p: argparse.ArgumentParser, a: argparse.Namespace) -> Serving:
    return Serving(
        listen=a.listen,
        log_level=a.log_level,
        metrics_security=resolve_metrics_security(p, a.metrics_auth, a.tls_cert_file, a.tls_key_file),
    )


def require_files(p: argparse.ArgumentParser, *flags: tuple[str, str]) -> None:
    """Stop at start, naming the flag, when a (flag, path) names no file."""
    for flag, path in flags:
        if not Path(path).is_file():
            p.error(f"{flag} {path}: no such file")


def add_host_flags(p: EnvArgumentParser, *, found: str = "sys/, dev/ and opt/aws/", dev_root: bool = False) -> None:
    """--host-root (and --host-dev-root for services that hand device paths to the container runtime)."""
    p.add_flag("--host-root", default="/", type=Path, help=f"host root where {found} are found")
    if dev_root:
        p.add_flag(
            "--host-dev-root",
            default="",
            help="root the container runtime resolves /dev/neuronN against, when the service sees the host under "
            "another path (e.g. --host-root=/host, --host-dev-root=/); default: --host-root",
        )


def add_node_flag(p: EnvArgumentParser, purpose: str = "") -> None:
    """--node-name, which falls back to $NODE_NAME (the chart sets it from the downward API)."""
    p.add_flag("--node-name", default="", help=f"this node's name{purpose} (default $NODE_NAME)")


def add_api_flags(p: EnvArgumentParser, *, purpose: str = "", timeout: str | None = None) -> None:
    """--kubeconfig, and --api-timeout where the service bounds its requests."""
    p.add_flag("--kubeconfig", default="", help=f"kubeconfig file{purpose}; default: the in-cluster service account")
    if timeout is not None:
        p.add_flag("--api-timeout", default=timeout, type=positive_duration, help="timeout of one API server request")


def add_ultraserver_labels_flag(p: EnvArgumentParser) -> None:
    """--ultraserver-labels, for the node agents that know the node's UltraServer identity."""
    p.add_bool_flag(
        "--ultraserver-labels",
        default=False,
        help="keep AWS's UltraServer labels (neuron.amazonaws.com/ultraserver-*) on this node's Node, from the "
        "driver's identity; needs patch on nodes (the chart's admission policy holds it to its own node and "
        "to those labels)",
    )


def add_health_source_flags(p: EnvArgumentParser) -> None:
    """The device-health sources of the plugin and the DRA driver: counters, the kernel log, verdicts."""
    p.add_flag(
        "--health-interval",
        default="500ms",
        type=positive_duration,
        help="time between reads of the error counters and device presence",
    )
    p.add_flag(
        "--health-quiet-period",
        default="5m",
        type=positive_duration,
        help="time without a new error before a device with a recoverable error is healthy again",
    )
    add_kernel_log_flags(p, "kernel log to watch for NEURON_HW_ERR lines", none_disables=True)
    p.add_flag(
        "--verdict-dir",
        default="",
        help="directory of per-device verdicts from neuron-problem-detector (a device it marks unhealthy is "
        "taken out of service); '' disables",
    )


class HealthSources(TypedDict):
    """The config's fields from `add_health_source_flags`."""

    health_interval: float
    health_quiet_period: float
    kmsg_path: Path | None
    kernel_log_format: str
    verdict_dir: Path | None


def resolve_health_sources(p: argparse.ArgumentParser, a: argparse.Namespace, host_kmsg: Path) -> HealthSources:
    """Stops at start on periods that do not fit together or a kernel log that does not fit its format."""
    resolve_health_periods(p, a.health_interval, a.health_quiet_period)
    return HealthSources(
        health_interval=a.health_interval,
        health_quiet_period=a.health_quiet_period,
        kmsg_path=resolve_kmsg(a.kmsg_path, host_kmsg, a.kernel_log_format, p),
        kernel_log_format=a.kernel_log_format,
        verdict_dir=optional_path(a.verdict_dir),
    )


def resolve_node_name(
    p: argparse.ArgumentParser, given: str, environ: Mapping[str, str], *, needed_by: str = ""
) -> str:
    """The node's name from --node-name or $NODE_NAME; stops at start when it is needed and missing or
    not a node name. `needed_by`: the flag that needs it, when the service can run without it."""
    node = given or environ.get("NODE_NAME", "")
    if not node:
        why = f"{needed_by} needs the node's name" if needed_by else "the node's name is needed"
        p.error(f"{why}: pass --node-name or set NODE_NAME (the chart sets it from the downward API)")
    require_node_name(p, node)
    return node


KERNEL_LOG_FORMATS = ("kmsg", "syslog")


def add_kernel_log_flags(p: EnvArgumentParser, what: str, *, none_disables: bool = False) -> None:
    """--kmsg-path and --kernel-log-format, of every service that reads the kernel log."""
    p.add_flag(
        "--kmsg-path",
        default="",
        help=f"{what}; default <host-root>/dev/kmsg" + ("; 'none' disables" if none_disables else ""),
    )
    p.add_flag(
        "--kernel-log-format",
        default="kmsg",
        choices=KERNEL_LOG_FORMATS,
        help="'kmsg': --kmsg-path is /dev/kmsg, or a file of its records (a simulated node); reading the host's "
        "/dev/kmsg takes CAP_SYSLOG and, in a container, privilege. 'syslog': --kmsg-path is a text file the "
        "host's syslog daemon writes (/var/log/kern.log on Ubuntu and Debian, /var/log/messages on Amazon "
        "Linux 2 and RHEL under <host-root>), read as an ordinary file and followed through log rotation",
    )


def resolve_kmsg(
    kmsg_path: str, host_kmsg: Path, fmt: str = "kmsg", p: argparse.ArgumentParser | None = None
) -> Path | None:
    """--kmsg-path of the health sources: '' is the host's kernel log (`host_kmsg`, from the host
    layout); 'none' disables watching it. With `p`, stops at start when --kernel-log-format does not
    fit the path (`check_kernel_log`)."""
    if kmsg_path == "none":
        return None
    if p is not None:
        check_kernel_log(p, kmsg_path, fmt)
    return Path(kmsg_path) if kmsg_path else host_kmsg


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


def resolve_health_periods(p: argparse.ArgumentParser, interval: float, quiet_period: float) -> None:
    if quiet_period < interval:
        p.error("--health-quiet-period must be at least --health-interval")


def optional_path(text: str) -> Path | None:
    return Path(text) if text else None
