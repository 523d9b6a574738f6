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
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from neuron_common.duration import DurationError, parse_duration
from neuron_model.resources import DEFAULT_PREFIX as DEFAULT_RESOURCE_PREFIX
from neuron_model.resources import is_valid_prefix

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
        dest: str | None = None,
    ) -> None:
        """A flag whose default comes from its environment variable when that is set."""
        name = env_name or self.env_name(flag)
        dest = dest or flag.lstrip("-").replace("-", "_")
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
            flag, default=default, type=type, choices=choices, metavar=metavar, dest=dest, help=f"{help} [env {name}]"
        )

    def add_bool_flag(self, flag: str, *, default: bool, help: str, dest: str | None = None) -> None:
        name = self.env_name(flag)
        if name in self.env:
            raw = self.env[name].strip().lower()
            if raw not in ("1", "0", "true", "false", "yes", "no"):
                self.error(f"environment variable {name}={self.env[name]!r} must be true or false")
            default = raw in ("1", "true", "yes")
        self.add_argument(
            flag, default=default, action=argparse.BooleanOptionalAction, dest=dest, help=f"{help} [env {name}]"
        )


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
    if not sep or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected host:port (e.g. 0.0.0.0:9100), got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


LOG_LEVELS = ("debug", "info", "warning", "error")


def log_level(text: str) -> str:
    value = text.lower()
    if value not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"must be debug, info, warning or error, got {text!r}")
    return value


def resource_prefix(text: str) -> str:
    """A `--resource-prefix`: a DNS subdomain outside kubernetes.io, or no extended resource can carry it."""
    if not is_valid_prefix(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid DNS subdomain outside kubernetes.io")
    return text


def optional_path(text: str) -> Path | None:
    return Path(text) if text else None


def optional_text(text: str) -> str | None:
    return text or None


# A Node's name is a DNS subdomain (RFC 1123).
NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def require_node_name(parser: argparse.ArgumentParser, name: str) -> None:
    """Stop at start, naming the flag, when `--node-name` cannot be a Node's name."""
    if len(name) > 253 or not NODE_NAME.fullmatch(name):
        parser.error(f"--node-name {name!r} is not a node name (a lowercase DNS subdomain)")


# A service's config is a frozen dataclass whose fields carry their flags: each field is written
# once, with its flag's default, help and type beside it. Groups that several services take
# (serving, host, node, API server, health sources) are dataclasses too, and a service's config
# inherits the groups it needs. A group or config may define `resolve(cls, p, values, environ)`, a
# class method that checks values that belong together and fills what comes from several flags or
# the environment; each class's own runs, bases first, with `cls` the service's config.

_FLAG = "neuron_common.config.flag"


@dataclass(frozen=True)
class Flag:
    default: Any
    help: str
    type: Callable[[str], Any] = str
    choices: Sequence[Any] | None = None
    convert: Callable[[Any], Any] | None = None  # applied after `choices`: the field's value from the flag's
    name: str = ""  # default: the field's name, as --kebab-case
    switch: bool = False  # --x/--no-x


def flag(
    default: Any,
    help: str,
    *,
    type: Callable[[str], Any] = str,
    choices: Sequence[Any] | None = None,
    convert: Callable[[Any], Any] | None = None,
    name: str = "",
) -> Any:
    """A config field set by its flag (or the flag's environment twin)."""
    return field(metadata={_FLAG: Flag(default, help, type, choices, convert, name)})


def switch(default: bool, help: str) -> Any:
    """A boolean config field set by --x / --no-x."""
    return field(metadata={_FLAG: Flag(default, help, switch=True)})


def derived(default: Any = None) -> Any:
    """A config field with no flag of its own, filled by a `resolve` from other flags."""
    return field(default=default)


class ServiceConfig:
    """The base of a service's config: its docstring is the command's description; `FLAGS` words or
    defaults a group's flag as this service needs it (`{"listen": {"default": "0.0.0.0:9840"}}`)."""

    PROG: ClassVar[str]
    ENV_PREFIX: ClassVar[str]
    FLAGS: ClassVar[Mapping[str, Mapping[str, Any]]] = {}


C = TypeVar("C", bound=ServiceConfig)


def _flags(cls: type[ServiceConfig]) -> list[tuple[str, Flag]]:
    flagged = [f for f in fields(cls) if _FLAG in f.metadata]  # type: ignore[arg-type]
    unknown = set(cls.FLAGS) - {f.name for f in flagged}
    if unknown:
        raise TypeError(f"{cls.__name__}.FLAGS names fields without a flag: {', '.join(sorted(unknown))}")
    return [(f.name, replace(f.metadata[_FLAG], **cls.FLAGS.get(f.name, {}))) for f in flagged]


def _flag_name(field_name: str, spec: Flag) -> str:
    return spec.name or "--" + field_name.replace("_", "-")


def config_parser(cls: type[ServiceConfig], env: Mapping[str, str] | None = None) -> EnvArgumentParser:
    """The service's parser: one flag per flag field of `cls`, in field order."""
    description = " ".join((cls.__doc__ or "").split())
    p = EnvArgumentParser(prog=cls.PROG, description=description, env_prefix=cls.ENV_PREFIX, env=env)
    for field_name, spec in _flags(cls):
        name = _flag_name(field_name, spec)
        if spec.switch:
            p.add_bool_flag(name, default=spec.default, help=spec.help, dest=field_name)
        else:
            p.add_flag(
                name, default=spec.default, help=spec.help, type=spec.type, choices=spec.choices, dest=field_name
            )
    return p


def config_from_args(
    cls: type[C], p: argparse.ArgumentParser, args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> C:
    """The config from parsed flags: each field's converted value, then each class's `resolve`."""
    environ = os.environ if env is None else env
    values: dict[str, Any] = {
        f.name: f.default
        for f in fields(cls)  # type: ignore[arg-type]
        if _FLAG not in f.metadata and f.default is not MISSING
    }
    for field_name, spec in _flags(cls):
        value = getattr(args, field_name)
        values[field_name] = spec.convert(value) if spec.convert is not None else value
    for klass in reversed(cls.__mro__):
        hook = klass.__dict__.get("resolve")
        if isinstance(hook, classmethod):
            hook.__func__(cls, p, values, environ)
    return cls(**values)


def parse_config(cls: type[C], argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> C:
    p = config_parser(cls, env)
    return config_from_args(cls, p, p.parse_args(argv), env)


# The groups several services take.

METRICS_AUTH = ("none", "kubernetes")


@dataclass(frozen=True)
class MetricsSecurity:
    """--metrics-auth=kubernetes: /metrics over TLS, served only to callers the API server vouches
    for (neuron_common.metrics_auth). The certificate and key are the service's serving pair."""

    cert: str
    key: str


@dataclass(frozen=True, kw_only=True)
class Listening:
    """--listen, --log-level and --metrics-auth, which every service takes; the service sets --listen's
    default."""

    listen: tuple[str, int] = flag("", "address of /healthz, /readyz, /metrics", type=listen_address)
    log_level: str = flag("info", "debug, info, warning or error", type=log_level)
    metrics_auth: bool = flag(
        "none",
        "'kubernetes': serve over TLS and answer /metrics only to a bearer token the API server authenticates "
        "(TokenReview) whose user may get the non-resource path /metrics (SubjectAccessReview); /healthz and "
        "/readyz stay open to the kubelet's probes. 'none': plain HTTP, /metrics open to whoever reaches the port",
        choices=METRICS_AUTH,
        convert=lambda value: value == "kubernetes",
    )


@dataclass(frozen=True, kw_only=True)
class Serving(Listening):
    """Listening, with the serving certificate --metrics-auth=kubernetes needs."""

    tls_cert_file: str = flag("", "serving certificate (PEM), needed by --metrics-auth=kubernetes")
    tls_key_file: str = flag("", "private key of --tls-cert-file (PEM)")
    metrics_security: MetricsSecurity | None = derived()

    @classmethod
    def resolve(cls, p: argparse.ArgumentParser, v: dict[str, Any], environ: Mapping[str, str]) -> None:
        v["metrics_security"] = resolve_metrics_security(p, v["metrics_auth"], v["tls_cert_file"], v["tls_key_file"])


def resolve_metrics_security(
    p: argparse.ArgumentParser, metrics_auth: bool, cert: str, key: str
) -> MetricsSecurity | None:
    """Stops at start when authentication is asked for without TLS: a bearer token must not cross
    the network in clear, nor a certificate be half given."""
    if (cert or key) and not (cert and key):
        p.error("--tls-cert-file and --tls-key-file go together: pass both or neither")
    if not metrics_auth:
        return None
    if not cert:
        p.error("--metrics-auth=kubernetes needs --tls-cert-file and --tls-key-file: callers send bearer tokens")
    require_files(p, ("--tls-cert-file", cert), ("--tls-key-file", key))
    return MetricsSecurity(cert, key)


@dataclass(frozen=True, kw_only=True)
class Host:
    host_root: Path = flag("/", "host root where sys/, dev/ and opt/aws/ are found", type=Path)


@dataclass(frozen=True, kw_only=True)
class HostDevices(Host):
    """For services that hand device paths to the container runtime."""

    host_dev_root: Path = flag(
        "",
        "root the container runtime resolves /dev/neuronN against, when the service sees the host under "
        "another path (e.g. --host-root=/host, --host-dev-root=/); default: --host-root",
        type=optional_path,
    )

    @classmethod
    def resolve(cls, p: argparse.ArgumentParser, v: dict[str, Any], environ: Mapping[str, str]) -> None:
        v["host_dev_root"] = v["host_dev_root"] or v["host_root"]


@dataclass(frozen=True, kw_only=True)
class Node:
    """--node-name, which falls back to $NODE_NAME (the chart sets it from the downward API)."""

    node_name: str = flag("", "this node's name (default $NODE_NAME)")
    # the switches (field: flag) that need the node's name, for a service that runs without it
    # while they are off; empty: always needed
    NODE_NAME_NEEDED_BY: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def resolve(cls, p: argparse.ArgumentParser, v: dict[str, Any], environ: Mapping[str, str]) -> None:
        needed_by = " and ".join(flag for name, flag in cls.NODE_NAME_NEEDED_BY.items() if v[name])
        if cls.NODE_NAME_NEEDED_BY and not needed_by:
            v["node_name"] = ""
        else:
            v["node_name"] = resolve_node_name(p, v["node_name"], environ, needed_by=needed_by)


@dataclass(frozen=True, kw_only=True)
class ApiServer:
    kubeconfig: str | None = flag(
        "", "kubeconfig file; default: the in-cluster service account", type=optional_text
    )  # None: the in-cluster service account


@dataclass(frozen=True, kw_only=True)
class ApiRequests(ApiServer):
    """For services that bound their API-server requests; the service sets the default."""

    api_timeout: float = flag("10s", "timeout of one API server request", type=positive_duration)


@dataclass(frozen=True, kw_only=True)
class ResourcePrefix:
    resource_prefix: str = flag(DEFAULT_RESOURCE_PREFIX, "extended resource prefix", type=resource_prefix)


@dataclass(frozen=True, kw_only=True)
class UltraServerLabels:
    """For the node agents that know the node's UltraServer identity."""

    ultraserver_labels: bool = switch(
        False,
        "keep AWS's UltraServer labels (neuron.amazonaws.com/ultraserver-*) on this node's Node, from the "
        "driver's identity; needs patch on nodes (the chart's admission policy holds it to its own node and "
        "to those labels)",
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


def require_files(p: argparse.ArgumentParser, *flags: tuple[str, str]) -> None:
    """Stop at start, naming the flag, when a (flag, path) names no file."""
    for flag_name, path in flags:
        if not Path(path).is_file():
            p.error(f"{flag_name} {path}: no such file")
