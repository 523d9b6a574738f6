"""How the cluster and e2e suites reach the test cluster (make cluster-up): where it lives, which
kubeconfig, kubectl, the node, a pod's phase, a kubelet restart, and waiting for a condition. One copy for both suites.

Both follow $KUBECONFIG, which defaults to the test cluster's; both also need the host side of
that cluster (the simulated node's root, the kubelet's pid file), so they are for that cluster.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import contextlib
import functools
import http.client
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from polling import until

from neuron_common.kube import Api, ApiError

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / ".venv" / "bin"
CLUSTER_DIR = Path(os.environ.get("CLUSTER_DIR", REPO / ".run/cluster"))
NODE = os.environ.get("NODE_NAME", "neuron-sim-node")
SIM_ROOT = Path(os.environ.get("SIM_ROOT", "/var/lib/neuron-sim/node"))
os.environ.setdefault("KUBECONFIG", str(CLUSTER_DIR / "admin.kubeconfig"))
KUBECONFIG = Path(os.environ["KUBECONFIG"])
# The registry up.sh starts for the cluster (tests/registry.sh, plain HTTP on loopback); containerd pulls from it
# through $CLUSTER_DIR/containerd/certs.d. Keep in step with up.sh's REGISTRY_ADDR.
REGISTRY = "127.0.0.1:5000"
# The image of up.sh's in-cluster API check (tests/cluster/apicheck), read from up.sh, which builds it
APICHECK_IMAGE = next(
    line.split("=", 1)[1]
    for line in (REPO / "tests/cluster/up.sh").read_text().splitlines()
    if line.startswith("APICHECK_IMAGE=")
)
# The cluster's own containerd 2.x client (up.sh links it; Debian's ctr, if any, is another version)
CTR = (
    str(CLUSTER_DIR / "containerd/bin/ctr"),
    "--address",
    str(CLUSTER_DIR / "containerd/containerd.sock"),
    "-n",
    "k8s.io",
)


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> str:
    result = subprocess.run(
        [str(BIN / "kubectl"), *args], input=stdin, capture_output=True, text=True, timeout=120, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
    return result.stdout


# --- reads in this process ------------------------------------------------------------------
# The suites poll (eventually(), every 0.5 s) and each kubectl is a process that loads the kubeconfig
# and the discovery cache: 1,453 of them cost about 160 CPU-seconds of a `make test` that is CPU-bound
# on two cores. Reads go to the API server from here instead; writes stay with kubectl, as a user's would.


class ApiServer:
    """GETs to the API server of a kubeconfig, through the services' own client
    (`neuron_common.kube.Api`: its kubeconfig reading, TLS and errors), for these synchronous suites.
    Reads on the main thread share one client and its event loop: the suites poll every half second,
    and a client built for each read (its TLS context, a new connection's handshake) cost 16 ms of
    CPU a read against about 3. A read from another thread (the migration test samples allocatable
    so) has a client of its own, since a client's session belongs to one event loop."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self._shared = self._client()
        self._loop: asyncio.AbstractEventLoop | None = None
        # the test clusters serve TLS and know their admin by its client certificate: a plain-http
        # server here is a wrong kubeconfig, not a cluster to read
        if not self._shared.server.startswith("https://"):
            raise ValueError(f"{kubeconfig}: the server {self._shared.server!r} is not https://host[:port]")

    def _client(self) -> Api:
        return Api.from_kubeconfig(str(self.kubeconfig), timeout=30)

    def get(self, path: str, **query: str) -> dict[str, Any]:
        """The object; an answer other than success raises AssertionError with the server's message,
        as kubectl(check=True) does, so eventually() keeps polling through a NotFound."""
        try:
            if threading.current_thread() is threading.main_thread():
                return self._shared_get(path, query)
            return asyncio.run(self._own_get(path, query))
        except ApiError as e:
            raise AssertionError(f"GET {path}: {e.status} {e.message}") from e

    def _shared_get(self, path: str, query: dict[str, str]) -> dict[str, Any]:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            atexit.register(self._close)
        request = functools.partial(self._shared.request, "GET", path, params=query or None)
        try:
            return self._loop.run_until_complete(request())
        except ApiError as e:
            if e.status != 0:
                raise
            # no answer: perhaps a kept connection the server has since closed (it restarted); a
            # fresh connection answers as a client of its own would have
            self._loop.run_until_complete(self._shared.close())
            return self._loop.run_until_complete(request())

    async def _own_get(self, path: str, query: dict[str, str]) -> dict[str, Any]:
        api = self._client()
        try:
            return await api.request("GET", path, params=query or None)
        finally:
            await api.close()

    def _close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.run_until_complete(self._shared.close())
            self._loop.close()


@dataclass(frozen=True)
class Resource:
    base: str  # /api/v1 or /apis/<group>/<version>
    plural: str
    namespaced: bool


class ResourceReader:
    """`kubectl get RESOURCE [NAME] -o json` in this process: the resource by any name kubectl takes
    (plural, singular, short name, as the API server's discovery lists them; refreshed once on a miss,
    since a chart's CRDs come and go), a list as kubectl prints one (`items`)."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self._names: dict[str, Resource] = {}

    @functools.cached_property
    def api(self) -> ApiServer:  # on the first read: importing this module needs no cluster
        return ApiServer(self.kubeconfig)

    def _discover(self) -> None:
        names: dict[str, Resource] = {}
        bases = ["/api/v1"] + [
            f"/apis/{g['preferredVersion']['groupVersion']}" for g in self.api.get("/apis")["groups"]
        ]
        # the core group last, so a short name both define (none today) means what kubectl means
        for base in reversed(bases):
            for r in self.api.get(base)["resources"]:
                if "/" in r["name"] or "get" not in r.get("verbs", ()):
                    continue  # subresources, and what cannot be read
                found = Resource(base, r["name"], bool(r["namespaced"]))
                for alias in (r["name"], r.get("singularName") or "", *r.get("shortNames", ())):
                    if alias:
                        names[alias.lower()] = found
        self._names = names

    def resource(self, name: str) -> Resource:
        key = name.lower().split(".", 1)[0]
        if key not in self._names:
            self._discover()
        if key not in self._names:
            raise AssertionError(f'the server doesn\'t have a resource type "{name}"')
        return self._names[key]

    def get(
        self,
        resource: str,
        name: str | None = None,
        *,
        namespace: str | None = "default",
        selector: str | None = None,
        field_selector: str | None = None,
    ) -> dict[str, Any]:
        """One object, or the list of them; `namespace=None` is kubectl's `-A` (ignored for a
        cluster-scoped resource, as kubectl ignores -n for one)."""
        r = self.resource(resource)
        path = r.base + (f"/namespaces/{namespace}" if r.namespaced and namespace else "") + f"/{r.plural}"
        if name is not None:
            return _without_managed_fields(self.api.get(f"{path}/{name}"))
        query = {k: v for k, v in (("labelSelector", selector), ("fieldSelector", field_selector)) if v}
        listed = self.api.get(path, **query)
        listed["items"] = [_without_managed_fields(o) for o in listed.get("items") or ()]
        return listed


def _without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """As kubectl prints an object unless asked for --show-managed-fields."""
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


# `kubectl get RESOURCE [NAME] -n NAMESPACE [-l SELECTOR] [--field-selector ...] -o json`, read in
# this process from $KUBECONFIG's API server
read = ResourceReader(KUBECONFIG).get


def node() -> dict[str, Any]:
    return read("node", NODE)


def node_status_update_period() -> float:
    """The kubelet's nodeStatusUpdateFrequency in seconds, from the configuration up.sh started it with
    (the API server will not proxy /configz to a loopback node): how long a change to allocatable can
    wait before it reaches the Node. The kubelet's default, 10 s, when the file does not set it."""
    config = yaml.safe_load((CLUSTER_DIR / "kubelet" / "config.yaml").read_text())
    return go_duration(config.get("nodeStatusUpdateFrequency", "10s"))


def go_duration(text: str) -> float:
    """A Go time.Duration as the kubelet prints it ("2s", "1m0s", "500ms") in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|µs|ns|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Go duration: {text!r}")
    return sum(float(n) * units[u] for n, u in parts)


def pod_phase(name: str, namespace: str = "default") -> str:
    return str(read("pod", name, namespace=namespace).get("status", {}).get("phase", ""))


def unschedulable(name: str, namespace: str = "default") -> str:
    """The scheduler's message once it has tried the pod and found no node ("0/1 nodes are available:
    1 Insufficient ..."), else "": the positive marker a test that a pod stays Pending waits for."""
    for condition in read("pod", name, namespace=namespace).get("status", {}).get("conditions", []):
        if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return str(condition.get("message", "")) or "Unschedulable"
    return ""


def restart_kubelet() -> None:
    """Stop the test cluster's kubelet and start it again with up.sh (which starts what is missing)."""
    os.kill(int((CLUSTER_DIR / "kubelet.pid").read_text()), signal.SIGTERM)
    time.sleep(2)
    result = subprocess.run(
        [str(REPO / "tests/cluster/up.sh")], capture_output=True, text=True, timeout=300, check=False
    )
    if result.returncode != 0:
        raise AssertionError(f"up.sh failed to restart the kubelet:\n{result.stdout}{result.stderr}")


def eventually(predicate: Callable[[], object], what: str, timeout: float = 120, interval: float = 0.5) -> Any:
    """Poll until `predicate` is true, through the errors of a cluster still settling; a failure names
    `what` and the last error on the way."""
    return until(predicate, what, timeout, interval, ignore=(AssertionError, KeyError, OSError, json.JSONDecodeError))


# The project's images have no shell (they are built from scratch): a workload is Python run by the
# image's own interpreter. SHOW_DEVICES prints what the container was given, then waits.
WORKLOAD_PYTHON = "/opt/neuron/bin/python3"
SHOW_DEVICES = (
    "import glob, os, time\n"
    "for d in sorted(glob.glob('/dev/neuron*')): print('device=' + d, flush=True)\n"
    "print('lnc=' + os.environ.get('NEURON_LOGICAL_NC_CONFIG', ''), flush=True)\n"
    "for k in ('MODE', 'SERVER_ID', 'NODE_ID'):\n"
    "    print('ultraserver_' + k.lower() + '=' + os.environ.get('NEURON_RT_ULTRASERVER_' + k, ''), flush=True)\n"
    "print('cores=' + os.environ.get('NEURON_RT_VISIBLE_CORES', ''), flush=True)\n"
    "time.sleep(3600)\n"
)


def workload_pod(
    name: str, namespace: str, image: str, resources: dict[str, Any], script: str = SHOW_DEVICES, **spec: Any
) -> str:
    """The e2e workload: a pod running `script` with a project image's own Python, given `resources`
    (limits or claims); `spec` adds to the pod's spec (schedulerName, resourceClaims, restartPolicy)."""
    return json.dumps({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": image,
                "imagePullPolicy": "Never",
                "command": [WORKLOAD_PYTHON, "-c", script],
                "resources": resources,
            }],
            **spec,
        },
    })  # fmt: skip


# --- the project's command-line tools, with the venv's bin first on PATH ----------------------


def run(
    *args: str | Path, check: bool = True, timeout: float = 600, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}")
    result = subprocess.run(
        [str(a) for a in args], input=stdin, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO,
        check=False,
    )  # fmt: skip
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, args))} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(BIN / "helm", *args, check=check)


def helm_test_suites(output: str) -> dict[str, str]:
    """`helm test`'s verdict on each of the release's test pods, by the pod's name after `-tests-`
    (components, allocation, scheduling): its phase."""
    return dict(re.findall(r"(?m)^TEST SUITE:\s+\S+-tests-([a-z]+)\n(?:.*\n){0,3}?Phase:\s+(\w+)", output))


def helm_test_checks(output: str) -> dict[str, bool]:
    """Each check whose lines `helm test --logs` printed (files/helm_test.py names its check on each line),
    and whether it passed: at least one `ok` and no `FAIL`."""
    verdicts: dict[str, bool] = {}
    for check, verdict in re.findall(r"(?m)^\[([a-z]+)\] (ok|FAIL):", output):
        verdicts[check] = verdicts.get(check, True) and verdict == "ok"
    return verdicts


def sim(*args: str | Path) -> None:
    run(BIN / "neuron-sim", *args)


# --- the device plugin as a host process on the simulated node ------------------------------------


def plugin_readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return int(r.status)
    except (urllib.error.URLError, OSError):
        return 0


@contextlib.contextmanager
def host_device_plugin(
    name: str, port: int, *flags: str, leftover_pods: Sequence[str] = ()
) -> Iterator[subprocess.Popen[bytes]]:
    """The device plugin run from the venv on the cluster's simulated node (no chart), registered and
    advertising 16 devices; stopped with SIGTERM afterwards, and `leftover_pods` deleted."""
    # No plugin yet: the kubelet reports 0 (or nothing) once a previous plugin's stream ended.
    # Starting before that, a pod could be scheduled on the stale figure and fail admission.
    eventually(
        lambda: node()["status"]["allocatable"].get("aws.amazon.com/neuron", "0") == "0", "no stale allocatable", 60
    )
    log = (CLUSTER_DIR / "logs" / f"{name}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "neuron_device_plugin", "--host-root", str(SIM_ROOT),
         "--pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock",
         "--listen", f"127.0.0.1:{port}", "--kmsg-path", "none", "--health-quiet-period", "2",
         # its own verdict directory: a detector's verdicts left on this host (make demo) must not leak in
         "--verdict-dir", str(CLUSTER_DIR / f"{name}-verdicts"), *flags],
        stdout=log, stderr=log,
    )  # fmt: skip
    try:
        eventually(lambda: plugin_readyz(port) == 200, "plugin registered")
        eventually(lambda: node()["status"]["allocatable"].get("aws.amazon.com/neuron") == "16", "allocatable", 60)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        for pod in leftover_pods:
            kubectl("delete", "pod", pod, "--ignore-not-found", "--wait=false", check=False)


def exporter_metrics(namespace: str) -> str:
    """The text the chart's node-metrics exporter in `namespace` serves on /metrics (its one live pod)."""
    pods = read("pods", namespace=namespace, selector="app.kubernetes.io/component=node-metrics")
    (exporter,) = [p for p in pods["items"] if p["metadata"].get("deletionTimestamp") is None]
    with urllib.request.urlopen(f"http://{exporter['status']['podIP']}:9840/metrics", timeout=10) as response:
        return response.read().decode()  # type: ignore[no-any-return]


class _NamedHttps(http.client.HTTPSConnection):
    """HTTPS to an address whose certificate is checked against another name (a pod IP, the name the
    chart's certificate is for), as Prometheus does with a monitor's tlsConfig.serverName."""

    def __init__(self, address: str, port: int, server_name: str, context: ssl.SSLContext) -> None:
        super().__init__(address, port, context=context, timeout=10)
        self._server_name = server_name
        self._tls = context

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


def https_get(
    address: str, port: int, path: str, *, ca_pem: bytes, server_name: str, token: str | None = None
) -> tuple[int, str]:
    """(status, body) of a GET over TLS verified against `ca_pem` for `server_name`."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    conn = _NamedHttps(address, port, server_name, context)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def secret_value(namespace: str, name: str, key: str) -> bytes:
    data = read("secret", name, namespace=namespace).get("data") or {}
    return base64.b64decode(data[key]) if key in data else b""
