"""Kueue's manager as a host process against a simcluster control plane (tests/test_kueue.py).

The real controller (`sigs.k8s.io/kueue/cmd/kueue`, built from its module at the version
tests/kueue/build.sh pins) with its own CRDs and webhook manifests from the same module, served the
way a cluster serves them but from this machine:
- the CRDs as Kueue's kustomization installs them, their conversion webhooks (the kustomization's
  `patches/webhook_in_*.yaml`) pointed at the manager by `clientConfig.url`;
- the Mutating- and ValidatingWebhookConfiguration of `config/components/webhook/manifests.yaml`,
  named as Kueue's release names them, each webhook's `clientConfig.service` turned into
  `url: https://127.0.0.1:<port><its path>` with a CA made here (`caBundle`). Only the webhooks of
  Kueue's own API group and of `batch` (the one integration turned on, `batch/job`) are registered:
  the others' paths are not served by a manager without their integration, and a webhook that
  fails closed on pods would refuse every pod;
- `internalCertManagement.enable: false`: the serving certificate is made here and handed over
  in `webhook.certDir`. With its own certificate management off the manager also reads its
  metrics server's certificate from a fixed path, `/etc/kueue/metrics/certs`, where cert-manager
  mounts it in Kueue's Deployment. The manager runs in a private mount namespace (util-linux's
  `unshare`) whose `/etc` is a read-only overlay of this scratch directory's `etc/` over the
  machine's `/etc`: nothing is written outside the scratch directory;
- leader election off (one replica), the visibility API server off (its `VisibilityOnDemand`
  gate: an aggregated API server, not used by the recipe).

Kueue suspends a Job and unsuspends it once admitted; the pods are the Job controller's work, so
kube-controller-manager (the pinned release's) runs too, with only its Job and garbage collector
controllers (the latter removes a deleted Job's pods and Workload, once its first sync of every API
group is over; the tests delete those themselves too, not to wait for it).

The objects of the recipe (docs/scheduling.md#kueue) are built here, and only here.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from polling import until_async
from simcluster.api import Api
from simcluster.controlplane import ControlPlane, free_port, k8s_bin, start_controller_manager, wait_until_ready
from simcluster.fleet import INSTANCE_TYPE_LABEL, NAMESPACE, NEURON, NEURONCORE

from neuron_model.placement_labels import NETWORK_NODE_LAYER_LABELS
from neuron_model.ultraserver import server_id_label

BUILD_SCRIPT = Path(__file__).parent / "build.sh"
BINARY = "kueue"
GROUP_VERSION = "kueue.x-k8s.io/v1beta2"
KUEUE_NAMESPACE = "kueue-system"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
HOSTNAME = "kubernetes.io/hostname"
# the API groups whose webhooks the manager serves with only the batch/job integration on
SERVED_GROUPS = frozenset({"kueue.x-k8s.io", "batch"})
METRICS_CERTS = "etc/kueue/metrics/certs"  # under the scratch directory; /etc/kueue/metrics/certs to the manager


def kueue_version() -> str:
    found = re.search(r"^KUEUE_VERSION=(v[0-9.]+)$", BUILD_SCRIPT.read_text(), re.M)
    assert found, "tests/kueue/build.sh pins no KUEUE_VERSION"
    return found.group(1)


def cache_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "neuron-helm-chart" / "kueue" / kueue_version()


def missing() -> list[str]:
    """What `make setup` has not built: the manager, its manifests, kube-controller-manager, unshare."""
    found = [str(p) for p in (cache_dir() / BINARY, cache_dir() / "config" / ".complete") if not p.exists()]
    if not (k8s_bin() / "kube-controller-manager").exists():
        found.append(str(k8s_bin() / "kube-controller-manager"))
    return found + [tool for tool in ("unshare", "mount") if shutil.which(tool) is None]


# -- the recipe's objects ---------------------------------------------------------------------


def topology(name: str = "aws-ultraserver") -> dict[str, Any]:
    """AWS's network node layers (farthest first), the 4-node UltraServer, the node."""
    levels = [*NETWORK_NODE_LAYER_LABELS, server_id_label(4), HOSTNAME]
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": label} for label in levels]},
    }


def resource_flavor(name: str, instance_type: str, topology_name: str | None = "aws-ultraserver") -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeLabels": {INSTANCE_TYPE_LABEL: instance_type}}
    if topology_name is not None:
        spec["topologyName"] = topology_name
    return {"apiVersion": GROUP_VERSION, "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": spec}


def cluster_queue(name: str, flavor: str, quota: Mapping[str, int]) -> dict[str, Any]:
    """Quota over the given resources (the device plugin's two by default) in one flavor."""
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": list(quota),
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [{"name": r, "nominalQuota": str(q)} for r, q in quota.items()],
                        }
                    ],
                }
            ],
        },
    }


def local_queue(name: str, cluster_queue_name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }


def job(
    name: str,
    queue: str,
    pods: int,
    limits: Mapping[str, int],
    *,
    required: str | None = None,
    preferred: str | None = None,
    scheduler: str = "default-scheduler",
    namespace: str = NAMESPACE,
) -> dict[str, Any]:
    """An Indexed Job of `pods` pods at once, each with `limits`, in `queue`; its pods asking Kueue
    to place them all within one domain of the `required` (or `preferred`) topology level. Not
    suspended: Kueue's webhook suspends it."""
    quantities = {
        r: str(q) for r, q in limits.items()
    }  # requests too: the API server defaults them from limits in Pods, not in a Job's template, and Kueue's DRA path reads requests
    annotations = {}
    if required is not None:
        annotations[REQUIRED_TOPOLOGY] = required
    if preferred is not None:
        annotations[PREFERRED_TOPOLOGY] = preferred
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "schedulerName": scheduler,
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": quantities, "limits": quantities},
                        }
                    ],
                },
            },
        },
    }


def device_quota(nodes: int, devices: int, cores: int) -> dict[str, int]:
    """The two resources' quota for `nodes` nodes of `devices` devices and `cores` cores each."""
    return {NEURON: nodes * devices, NEURONCORE: nodes * cores}


# -- the manager ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kueue:
    dir: Path
    webhook_port: int
    health_port: int


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=30)


def _serving_certificate(certs: Path) -> Path:
    """A CA and the manager's serving certificate for 127.0.0.1 (tls.crt, tls.key in `certs`, the
    names controller-runtime's webhook server reads); returns the CA's path."""
    certs.mkdir(parents=True)
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req", "-x509", *curve, "-keyout", certs / "ca.key", "-out", certs / "ca.crt", "-subj", "/CN=kueue-sim-ca",
        "-days", "2",
    )  # fmt: skip
    _openssl(
        "req", "-x509", *curve, "-CA", certs / "ca.crt", "-CAkey", certs / "ca.key", "-days", "2",
        "-keyout", certs / "tls.key", "-out", certs / "tls.crt", "-subj", "/CN=kueue-webhook",
        "-addext", "subjectAltName=IP:127.0.0.1", "-addext", "extendedKeyUsage=serverAuth",
    )  # fmt: skip
    return certs / "ca.crt"


def _url(port: int, path: str) -> str:
    return f"https://127.0.0.1:{port}{path}"


def crds(port: int, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's CRDs, each patched as its kustomization patches it (conversion webhooks), by url."""
    config = cache_dir() / "config" / "crd"
    by_name = {}
    for path in sorted((config / "bases").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        by_name[crd["metadata"]["name"]] = crd
    kustomization = yaml.safe_load((config / "kustomization.yaml").read_text())
    for patch_path in kustomization.get("patches") or []:
        patch = yaml.safe_load((config / patch_path["path"]).read_text())
        conversion = patch["spec"]["conversion"]
        service = conversion["webhook"]["clientConfig"].pop("service")
        conversion["webhook"]["clientConfig"] = {"url": _url(port, service["path"]), "caBundle": ca_bundle}
        by_name[patch["metadata"]["name"]]["spec"]["conversion"] = conversion
    return list(by_name.values())


def webhook_configurations(port: int, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's two webhook configurations, with the webhooks the manager serves, by url."""
    documents = yaml.safe_load_all((cache_dir() / "config" / "webhook" / "manifests.yaml").read_text())
    configurations = []
    for doc in documents:
        served = []
        for hook in doc["webhooks"]:
            if {g for rule in hook["rules"] for g in rule["apiGroups"]} <= SERVED_GROUPS:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": _url(port, path), "caBundle": ca_bundle}
                served.append(hook)
        doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]  # Kueue's release prefixes its objects
        doc["webhooks"] = served
        configurations.append(doc)
    return configurations


def manager_configuration(
    kueue_dir: Path, webhook_port: int, health_port: int, extra: Mapping[str, Any]
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{free_port()}"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(kueue_dir / "certs")},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 100, "burst": 200},
        "integrations": {"frameworks": ["batch/job"]},
        "featureGates": {"VisibilityOnDemand": False},
    }
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def _in_private_etc(kueue_dir: Path, argv: Sequence[str | Path]) -> list[str | Path]:
    """`argv` in a mount namespace whose /etc is the scratch directory's etc/ over the machine's."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    script = f'mount -t overlay overlay -o ro,lowerdir={kueue_dir / "etc"}:/etc /etc && exec "$@"'
    return ["unshare", *user, "--mount", "--", "sh", "-c", script, "kueue", *argv]


async def _established(api: Api, name: str) -> None:
    async def established() -> bool:
        crd = await api.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    await until_async(established, f"CRD {name} established", 30.0, 0.2, TimeoutError)


async def start_job_controller(cp: ControlPlane) -> None:
    """kube-controller-manager with its Job and garbage collector controllers only."""
    await start_controller_manager(cp, ["job-controller", "garbage-collector-controller"])


async def start_kueue(api: Api, cp: ControlPlane, config: Mapping[str, Any] | None = None) -> Kueue:
    """Installs Kueue's CRDs and webhook configurations and starts its manager, with `config`
    merged over the Configuration above; returns once the manager is ready (its webhooks served)."""
    kueue_dir = cp.dir / "kueue"
    webhook_port, health_port = free_port(), free_port()
    ca = _serving_certificate(kueue_dir / "certs")
    metrics = kueue_dir / METRICS_CERTS
    metrics.mkdir(parents=True)
    for name in ("tls.crt", "tls.key"):
        shutil.copy(kueue_dir / "certs" / name, metrics / name)
    ca_bundle = base64.b64encode(ca.read_bytes()).decode()
    for crd in crds(webhook_port, ca_bundle):
        await api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    for crd in crds(webhook_port, ca_bundle):
        await _established(api, crd["metadata"]["name"])
    for hooks in webhook_configurations(webhook_port, ca_bundle):
        plural = (
            "mutatingwebhookconfigurations"
            if hooks["kind"].startswith("Mutating")
            else "validatingwebhookconfigurations"
        )
        await api.create(f"/apis/admissionregistration.k8s.io/v1/{plural}", hooks)
    await api.create("/api/v1/namespaces", {"metadata": {"name": KUEUE_NAMESPACE}})
    config_file = kueue_dir / "configuration.yaml"
    config_file.write_text(
        json.dumps(manager_configuration(kueue_dir, webhook_port, health_port, config or {}), indent=1)
    )
    argv: list[str | Path] = [cache_dir() / BINARY, f"--config={config_file}", "--zap-log-level=2"]
    cp.processes.start("kueue", _in_private_etc(kueue_dir, argv), env={**os.environ, "KUBECONFIG": str(cp.kubeconfig)})
    await asyncio.to_thread(wait_until_ready, cp.processes, "kueue", health_port, "/readyz", 90, None)
    return Kueue(kueue_dir, webhook_port, health_port)


def kueue_path(kind: str, name: str = "", namespace: str | None = None) -> str:
    """The API path of Kueue objects of `kind` (plural), namespaced where `namespace` is given."""
    base = f"/apis/{GROUP_VERSION}" + (f"/namespaces/{namespace}" if namespace else "")
    return f"{base}/{kind}" + (f"/{name}" if name else "")
