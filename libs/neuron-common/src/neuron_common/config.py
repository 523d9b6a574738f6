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
from collections.abc import Callable, Mapping
from typing import Any

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
