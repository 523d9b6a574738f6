"""Flags of `neuron-scheduler-extender`, each with a `NEURON_EXTENDER_*` environment twin."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from neuron_common.config import (
    EnvArgumentParser,
    add_api_flags,
    add_serving_flags,
    parse_flags,
    positive_duration,
    require_files,
    require_resource_prefix,
)
from neuron_model import resources

DEFAULT_LISTEN = "0.0.0.0:9843"


@dataclass(frozen=True)
class Config:
    listen: tuple[str, int]
    log_level: str
    kubeconfig: str | None
    resource_prefix: str
    report_max_age: float
    group_reservation_ttl: float
    api_timeout: float
    leader_elect: bool
    lease_name: str
    lease_namespace: str
    identity: str
    advertise_url: str  # "" until the port is known: see `url_for`
    lease_duration: float
    renew_deadline: float
    retry_period: float
    scheduler_names: frozenset[str] = frozenset({"neuron-scheduler"})
    tls: TlsFiles | None = None
    metrics_auth: bool = False  # --metrics-auth=kubernetes, over the TLS above
    evict_degraded_groups: bool = False


@dataclass(frozen=True)
class TlsFiles:
    """Mutual TLS: the extender's serving certificate, and the CA whose client certificates may call
    the extender verbs (kube-scheduler's, and the other replica's when it relays to the leader)."""

    cert: str
    key: str
    client_ca: str
    server_name: str  # the name the certificate is for, checked when relaying to the leader by IP


def parser(env: Mapping[str, str] | None = None) -> EnvArgumentParser:
    p = EnvArgumentParser(
        prog="neuron-scheduler-extender",
        description="kube-scheduler extender for AWS Neuron: filter passes a node only where the pod's devices or "
        "cores can be given as a connected set (from the NeuronNode reports each node's device plugin publishes, "
        "and the pods bound there), prioritize prefers the node left least fragmented, bind re-checks and binds. "
        "Serves POST /filter, /prioritize, /bind and GET /healthz, /readyz, /metrics on one port.",
        env_prefix="NEURON_EXTENDER_",
        env=env,
    )
    add_serving_flags(p, DEFAULT_LISTEN, what="the extender's HTTP server", tls=False)
    add_api_flags(p)
    p.add_flag(
        "--resource-prefix",
        default=resources.DEFAULT_PREFIX,
        help="prefix of the Neuron resources (<prefix>/neuron, <prefix>/neuroncore), as the device plugin advertises",
    )
    p.add_flag(
        "--report-max-age",
        default="2m",
        type=positive_duration,
        help="refuse a node whose NeuronNode report is older than this (its device plugin heartbeats every 30s)",
    )
    p.add_flag(
        "--group-reservation-ttl",
        default="2m",
        type=positive_duration,
        help="how long an UltraServer chosen for a group of pods stays held for it after its last pod was filtered, "
        "while none of its pods is bound (a partly bound group keeps it until the group is whole)",
    )
    p.add_bool_flag(
        "--evict-degraded-groups",
        default=False,
        help="evict every pod of an UltraServer group of pods when a node of its UltraServer turns unhealthy "
        "(NeuronHealth condition, the problem detector's taint, or unhealthy devices in its NeuronNode report), so "
        "its controller places it again; off: the group is only reported (Events on its pods, a metric)",
    )
    p.add_flag(
        "--api-timeout", default="10s", type=positive_duration, help="timeout of one API server request (not watches)"
    )
    p.add_bool_flag(
        "--leader-elect",
        default=True,
        help="take part in leader election on a Lease; only the leader is ready (run 2 replicas for availability)",
    )
    p.add_flag("--lease-name", default="neuron-scheduler-extender", help="name of the Lease")
    p.add_flag(
        "--lease-namespace",
        default="",
        help="namespace of the Lease (default $POD_NAMESPACE, which the chart sets, else default)",
    )
    p.add_flag(
        "--identity",
        default="",
        help="this replica's name in the Lease (default $POD_NAME or the host name, plus a random suffix)",
    )
    p.add_flag(
        "--advertise-url",
        default="",
        help="URL the other replica forwards requests to while this one leads "
        "(default http://$POD_IP:<listen port>, which the chart sets)",
    )
    p.add_flag(
        "--lease-duration",
        default="15s",
        type=positive_duration,
        help="how long a standby waits after the last renewal it saw before taking the lease",
    )
    p.add_flag(
        "--renew-deadline",
        default="10s",
        type=positive_duration,
        help="the leader stops leading when it could not renew for this long (less than --lease-duration)",
    )
    p.add_flag(
        "--retry-period", default="2s", type=positive_duration, help="time between attempts to take or renew the lease"
    )
    p.add_flag(
        "--scheduler-name",
        default="neuron-scheduler",
        help="the schedulerNames whose pods /bind binds, comma-separated (the chart's second scheduler and its "
        "other profiles); others are refused",
    )
    p.add_flag(
        "--tls-cert-file", default="", help="serving certificate (PEM); with --tls-key-file and --client-ca-file"
    )
    p.add_flag("--tls-key-file", default="", help="private key of --tls-cert-file (PEM)")
    p.add_flag(
        "--client-ca-file",
        default="",
        help="CA of the client certificates allowed to call /filter, /prioritize and /bind (PEM); "
        "the health and metrics paths need none. All three TLS flags, or none (plain HTTP: trusts the network)",
    )
    p.add_flag(
        "--tls-server-name",
        default="",
        help="name in the serving certificate, checked when a standby relays to the leader by IP "
        "(default: the certificate's first DNS name)",
    )
    return p


def parse(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    p, a, environ = parse_flags(parser, argv, env)
    require_resource_prefix(p, a.resource_prefix)
    if a.leader_elect and not a.renew_deadline < a.lease_duration:
        p.error(
            f"--renew-deadline ({a.renew_deadline:g}s) must be shorter than --lease-duration ({a.lease_duration:g}s): "
            "a leader cut off from the API server must stop before a standby can take over"
        )
    if a.leader_elect and not a.retry_period < a.renew_deadline:
        p.error(f"--retry-period ({a.retry_period:g}s) must be shorter than --renew-deadline ({a.renew_deadline:g}s)")
    if a.advertise_url and not a.advertise_url.startswith(("http://", "https://")):
        p.error(f"--advertise-url must be an http:// or https:// URL, got {a.advertise_url!r}")
    if not [n for n in a.scheduler_name.split(",") if n.strip()]:
        p.error("--scheduler-name needs at least one scheduler name")
    tls_flags = (a.tls_cert_file, a.tls_key_file, a.client_ca_file)
    if any(tls_flags) and not all(tls_flags):
        p.error("--tls-cert-file, --tls-key-file and --client-ca-file go together: pass all three or none")
    tls = None
    if all(tls_flags):
        require_files(p, *zip(("--tls-cert-file", "--tls-key-file", "--client-ca-file"), tls_flags, strict=True))
        tls = TlsFiles(a.tls_cert_file, a.tls_key_file, a.client_ca_file, a.tls_server_name)
    if a.metrics_auth == "kubernetes" and tls is None:
        p.error("--metrics-auth=kubernetes needs the extender's TLS flags: callers send bearer tokens")
    scheme = "https" if tls else "http"
    host = environ.get("POD_IP") or (a.listen[0] if a.listen[0] not in ("0.0.0.0", "::", "") else socket.gethostname())
    identity = a.identity or f"{environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    return Config(
        listen=a.listen,
        log_level=a.log_level,
        kubeconfig=a.kubeconfig or None,
        resource_prefix=a.resource_prefix,
        report_max_age=a.report_max_age,
        group_reservation_ttl=a.group_reservation_ttl,
        api_timeout=a.api_timeout,
        leader_elect=a.leader_elect,
        lease_name=a.lease_name,
        lease_namespace=a.lease_namespace or environ.get("POD_NAMESPACE") or "default",
        identity=identity,
        advertise_url=a.advertise_url.rstrip("/") or f"{scheme}://{_bracketed(host)}:{{port}}",
        lease_duration=a.lease_duration,
        renew_deadline=a.renew_deadline,
        retry_period=a.retry_period,
        scheduler_names=frozenset(n.strip() for n in a.scheduler_name.split(",") if n.strip()),
        tls=tls,
        metrics_auth=a.metrics_auth == "kubernetes",
        evict_degraded_groups=a.evict_degraded_groups,
    )


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
