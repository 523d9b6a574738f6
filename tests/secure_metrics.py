"""The chart's protected /metrics (nodeMetrics.secureMetrics=true) set up on a private
kube-apiserver, for tests/integration/test_metrics_auth.py and bench/bench_metrics_auth.py: the
chart's RBAC and ServiceAccounts exactly as rendered, its generated certificate written as its
Secret volume mounts it, a kubeconfig with the exporter's own ServiceAccount token (it reviews
with that, as in its pod), the exporter's --metrics-auth and --tls-* flags as the chart sets them,
and ServiceAccount tokens for the callers.
"""

from __future__ import annotations

import base64
import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chart.test_chart import render
from chart_tools import sets
from simcluster.controlplane import ControlPlane

from neuron_common.kube import Api

NAMESPACE = "kube-system"  # as chart.test_chart renders
FULLNAME = "neuron-helm-chart"
EXPORTER_SA = f"{FULLNAME}-node-metrics"
SCRAPER_SA = f"{FULLNAME}-metrics-scraper"
RBAC = {
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "ServiceAccount": f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
}
MOUNTED_TLS = "/etc/neuron/metrics-tls"  # where the chart mounts the Secret in the exporter's pod


def chart_objects() -> list[dict[str, Any]]:
    docs = render(*sets(nodeMetrics__secureMetrics=True, nodeMetrics__monitoring__force=True))
    return [d for d in docs if d.get("kind")]


async def token_of(admin: Api, account: str) -> str:
    """A fresh token of `account` (each call a different one, so an uncached one to a reviewer)."""
    review = await admin.create(
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )
    return str(review["status"]["token"])


@dataclass(frozen=True)
class SecureExporter:
    tls: Path  # ca.crt, tls.crt, tls.key: the chart's generated certificate
    kubeconfig: Path  # the exporter's own ServiceAccount token, for its reviews
    args: list[str]  # the chart's --metrics-auth and --tls-* flags, its paths pointed at `tls`
    endpoint: dict[str, Any]  # the chart's ServiceMonitor endpoint: how Prometheus scrapes it

    @property
    def server_name(self) -> str:
        return str(self.endpoint["tlsConfig"]["serverName"])

    def client_context(self) -> ssl.SSLContext:
        """What a scraper trusts: the chart's CA (check the name against `server_name`)."""
        return ssl.create_default_context(cafile=str(self.tls / "ca.crt"))

    def exporter_args(self) -> list[str]:
        return ["--kubeconfig", str(self.kubeconfig), *self.args]


async def install(cp: ControlPlane, admin: Api, work: Path) -> SecureExporter:
    """The chart's RBAC and ServiceAccounts into `cp`, its certificate and the exporter's
    kubeconfig into `work`."""
    docs = chart_objects()
    for doc in docs:
        if doc["kind"] in RBAC and doc["metadata"]["name"].startswith(FULLNAME):
            await admin.create(RBAC[doc["kind"]], doc)
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == f"{FULLNAME}-metrics-tls"]
    tls = work / "tls"
    tls.mkdir(parents=True)
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (tls / key).write_bytes(base64.b64decode(secret["data"][key]))
    (exporter_ds,) = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == EXPORTER_SA]
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    (endpoint,) = monitor["spec"]["endpoints"]
    kubeconfig = work / "exporter.kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": cp.server, "certificate-authority": str(cp.credentials.ca)}}],
                "users": [{"name": "u", "user": {"token": await token_of(admin, EXPORTER_SA)}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )  # fmt: skip
    args = exporter_ds["spec"]["template"]["spec"]["containers"][0]["args"]
    secure_args = [a.replace(MOUNTED_TLS, str(tls)) for a in args if a.startswith(("--metrics-auth", "--tls-"))]
    return SecureExporter(tls, kubeconfig, secure_args, endpoint)
