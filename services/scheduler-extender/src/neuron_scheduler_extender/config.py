"""Flags of `neuron-scheduler-extender`, each with a `NEURON_EXTENDER_*` environment twin."""

from __future__ import annotations

import argparse
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from neuron_common.config import (
    ApiRequests,
    EnvArgumentParser,
    Listening,
    ResourcePrefix,
    ServiceConfig,
    config_parser,
    derived,
    flag,
    parse_config,
    positive_duration,
    require_files,
    switch,
)
from neuron_common.leader import LeaderElection

DEFAULT_LISTEN = "0.0.0.0:9843"


def scheduler_names(text: str) -> frozenset[str]:
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("needs at least one scheduler name")
    return names


@dataclass(frozen=True)
class TlsFiles:
    """Mutual TLS: the extender's serving certificate, and the CA whose client certificates may call
    the extender verbs (kube-scheduler's, and the other replica's when it relays to the leader)."""

    cert: str
    key: str
    client_ca: str
    server_name: str  # the name the certificate is for, checked when relaying to the leader by IP


@dataclass(frozen=True, kw_only=True)
class Config(LeaderElection, Listening, ApiRequests, ResourcePrefix, ServiceConfig):
    """kube-scheduler extender for AWS Neuron: filter passes a node only where the pod's devices or
    cores can be given as a connected set (from the NeuronNode reports each node's device plugin
    publishes, and the pods bound there), prioritize prefers the node left least fragmented, bind
    re-checks and binds. Serves POST /filter, /prioritize, /bind and GET /healthz, /readyz, /metrics on
    one port."""

    PROG: ClassVar[str] = "neuron-scheduler-extender"
    ENV_PREFIX: ClassVar[str] = "NEURON_EXTENDER_"
    FLAGS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "listen": {"default": DEFAULT_LISTEN, "help": "address of the extender's HTTP server"},
        "resource_prefix": {
            "help": "prefix of the Neuron resources (<prefix>/neuron, <prefix>/neuroncore), as the device plugin "
            "advertises"
        },
        "api_timeout": {"help": "timeout of one API server request (not watches)"},
        "leader_elect": {
            "help": "take part in leader election on a Lease; only the leader is ready (run 2 replicas for "
            "availability)"
        },
        "lease_name": {"default": "neuron-scheduler-extender"},
    }

    report_max_age: float = flag(
        "2m",
        "refuse a node whose NeuronNode report is older than this (its device plugin heartbeats every 30s)",
        type=positive_duration,
    )
    group_reservation_ttl: float = flag(
        "2m",
        "how long an UltraServer chosen for a group of pods stays held for it after its last pod was filtered, while "
        "none of its pods is bound (a partly bound group keeps it until the group is whole)",
        type=positive_duration,
    )
    evict_degraded_groups: bool = switch(
        False,
        "evict every pod of an UltraServer group of pods when a node of its UltraServer turns unhealthy (NeuronHealth "
        "condition, the problem detector's taint, or unhealthy devices in its NeuronNode report), so its controller "
        "places it again; off: the group is only reported (Events on its pods, a metric)",
    )
    advertise_url: str = flag(
        "",
        "URL the other replica forwards requests to while this one leads (default http://$POD_IP:<listen port>, "
        "which the chart sets)",
    )  # "{port}" stands for the listening port until it is known
    scheduler_names: frozenset[str] = flag(
        "neuron-scheduler",
        "the schedulerNames whose pods /bind binds, comma-separated (the chart's second scheduler and its other "
        "profiles); others are refused",
        type=scheduler_names,
        name="--scheduler-name",
    )
    tls_cert_file: str = flag("", "serving certificate (PEM); with --tls-key-file and --client-ca-file")
    tls_key_file: str = flag("", "private key of --tls-cert-file (PEM)")
    client_ca_file: str = flag(
        "",
        "CA of the client certificates allowed to call /filter, /prioritize and /bind (PEM); the health and metrics "
        "paths need none. All three TLS flags, or none (plain HTTP: trusts the network)",
    )
    tls_server_name: str = flag(
        "",
        "name in the serving certificate, checked when a standby relays to the leader by IP (default: the "
        "certificate's first DNS name)",
    )
    tls: TlsFiles | None = derived()

    @classmethod
    def resolve(cls, p: argparse.ArgumentParser, v: dict[str, Any], environ: Mapping[str, str]) -> None:
        if v["advertise_url"] and not v["advertise_url"].startswith(("http://", "https://")):
            p.error(f"--advertise-url must be an http:// or https:// URL, got {v['advertise_url']!r}")
        tls_flags = ("--tls-cert-file", "--tls-key-file", "--client-ca-file")
        tls_files = (v["tls_cert_file"], v["tls_key_file"], v["client_ca_file"])
        if any(tls_files) and not all(tls_files):
            p.error("--tls-cert-file, --tls-key-file and --client-ca-file go together: pass all three or none")
        if all(tls_files):
            require_files(p, *zip(tls_flags, tls_files, strict=True))
            v["tls"] = TlsFiles(*tls_files, v["tls_server_name"])
        if v["metrics_auth"] and v["tls"] is None:
            p.error("--metrics-auth=kubernetes needs the extender's TLS flags: callers send bearer tokens")
        scheme = "https" if v["tls"] else "http"
        listen_host = v["listen"][0]
        host = environ.get("POD_IP") or (
            listen_host if listen_host not in ("0.0.0.0", "::", "") else socket.gethostname()
        )
        v["advertise_url"] = v["advertise_url"].rstrip("/") or f"{scheme}://{_bracketed(host)}:{{port}}"


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parser(env: Mapping[str, str] | None = None) -> EnvArgumentParser:
    return config_parser(Config, env)


def parse(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    return parse_config(Config, argv, env)
