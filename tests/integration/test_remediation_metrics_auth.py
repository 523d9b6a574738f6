"""The remediation controller with `remediation.secureMetrics=true`, and `helm test`'s remediation check, on a real
kube-apiserver: the chart's own objects (its RBAC and ServiceAccounts as rendered, its generated certificate, the
controller's arguments as its Deployment gives them), the real controller as its own process reviewing tokens with
its ServiceAccount's token, and files/helm_test.py's `remediation` check listing the controller's pod with the
chart's test ServiceAccount and reading it as the chart's scraper over the chart's CA.

/metrics: no token is 401, a token whose user may not `get /metrics` 403, the scraper's token 200; /readyz stays
open. The check passes while the controller runs and leads, and fails with a token not allowed, with more replicas
expected than run, and once the controller is stopped.

STAND-IN: no kubelet runs. The controller's Pod object is created bound to a node and its status written with the
podIP 127.0.0.1, where the process listens, as a kubelet would report it. The check's in-cluster configuration is
replaced by a client of the same ServiceAccount's token (the test pod's own).
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import os
import re
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import processes
import pytest
from chart.test_chart import CHART, of_kind, render
from chart_tools import sets
from polling import until
from simcluster.controlplane import ControlPlane, free_port, private_control_plane

from neuron_common.kube import STRATEGIC_MERGE_PATCH, Api, ApiError

pytestmark = pytest.mark.integration

NAMESPACE = "kube-system"  # as chart.test_chart renders
FULL = "neuron-helm-chart"
CONTROLLER = f"{FULL}-remediation-controller"
SCRAPER = f"{FULL}-metrics-scraper"
TESTS = f"{FULL}-tests"
STRANGER = "nosy"
MOUNTED_TLS = "/etc/neuron/metrics-tls"
PATHS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
}


def load_helm_test() -> ModuleType:
    spec = importlib.util.spec_from_file_location("helm_test_remediation", CHART / "files" / "helm_test.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Stack:
    cp: ControlPlane
    work: Path
    port: int
    tls: Path  # ca.crt, tls.crt, tls.key: the chart's generated certificate
    server_name: str  # what the chart's monitor checks the certificate against
    tokens: dict[str, str]  # scraper, stranger, tests
    check_env: dict[str, str]  # the chart's test pod's REMEDIATION_* variables
    controller: subprocess.Popen[bytes]


async def _token(admin: Api, account: str) -> str:
    answer = await admin.create(
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )
    return str(answer["status"]["token"])


async def _install(cp: ControlPlane, work: Path, docs: list[dict[str, Any]], port: int) -> dict[str, Any]:
    """The chart's RBAC and ServiceAccounts, a ServiceAccount no role names, the controller's Pod object; the tokens
    and the controller's kubeconfig."""
    admin = Api(cp.server, ssl_context=cp.credentials.ssl_context())
    try:
        for kind, path in PATHS.items():
            for doc in of_kind(docs, kind):
                await admin.create(path.format(ns=doc["metadata"].get("namespace", NAMESPACE)), doc)
        for account in (STRANGER, "default"):
            try:
                await admin.create(PATHS["ServiceAccount"].format(ns=NAMESPACE), {"metadata": {"name": account}})
            except ApiError as exc:
                if exc.status != 409:  # the API server's own "default" may already be there
                    raise
        (deployment,) = [d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == CONTROLLER]
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "remediator-0", "namespace": NAMESPACE,
                         "labels": deployment["spec"]["template"]["metadata"]["labels"]},
            "spec": {"nodeName": "n1", "automountServiceAccountToken": False,
                     "containers": [{"name": "remediation-controller", "image": "stand-in"}]},
        }  # fmt: skip
        await admin.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
        status = {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
                  "conditions": [{"type": "Ready", "status": "True"}]}  # fmt: skip
        await admin.patch(
            f"/api/v1/namespaces/{NAMESPACE}/pods/remediator-0/status", {"status": status}, STRATEGIC_MERGE_PATCH
        )
        sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        kubeconfig = work / "remediation.kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": cp.server, "certificate-authority": str(cp.credentials.ca)}}],
            "users": [{"name": "u", "user": {"token": await _token(admin, sa)}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        }))  # fmt: skip
        tokens = {name: await _token(admin, account) for name, account in
                  (("scraper", SCRAPER), ("stranger", STRANGER), ("tests", TESTS))}  # fmt: skip
        return {"kubeconfig": kubeconfig, "tokens": tokens, "deployment": deployment}
    finally:
        await admin.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("remediation-metrics-auth")
    docs = [
        d
        for d in render(
            *sets(remediation__enabled=True, remediation__secureMetrics=True, remediation__replicas=1),
            "--api-versions", "monitoring.coreos.com/v1",
        )
        if d.get("kind")
    ]  # fmt: skip
    (secret,) = [d for d in of_kind(docs, "Secret") if d["metadata"]["name"] == f"{FULL}-metrics-tls"]
    tls = work / "tls"
    tls.mkdir()
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (tls / key).write_bytes(base64.b64decode(secret["data"][key]))
    (monitor,) = [d for d in of_kind(docs, "ServiceMonitor") if d["metadata"]["name"] == CONTROLLER]
    (endpoint,) = monitor["spec"]["endpoints"]
    (test_pod,) = [d for d in of_kind(docs, "Pod") if d["metadata"]["name"] == f"{FULL}-tests-components"]
    check_env = {e["name"]: e["value"] for e in test_pod["spec"]["containers"][0]["env"] if "value" in e}
    port = free_port()
    with private_control_plane("remediation-metrics-auth-cp-") as cp:
        installed = asyncio.run(_install(cp, work, docs, port))
        (c,) = installed["deployment"]["spec"]["template"]["spec"]["containers"]
        # the chart's arguments, its mount moved to `tls`, listening where the stand-in Pod's IP says
        args = [a.replace(MOUNTED_TLS, str(tls)) for a in c["args"] if not a.startswith("--listen=")]
        env = {**os.environ, "POD_NAMESPACE": NAMESPACE, "POD_NAME": "remediator-0"}
        with open(work / "remediator.log", "wb") as log:
            controller = subprocess.Popen(
                [sys.executable, "-m", "neuron_remediation", f"--kubeconfig={installed['kubeconfig']}",
                 f"--listen=127.0.0.1:{port}", *args],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        try:
            yield Stack(cp, work, port, tls, endpoint["tlsConfig"]["serverName"], installed["tokens"],
                        check_env, controller)  # fmt: skip
        finally:
            processes.stop(controller)


async def _status(stack: Stack, path: str, token: str | None) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(stack.tls / "ca.crt"))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http:
        url = f"https://127.0.0.1:{stack.port}{path}"
        async with http.get(url, headers=headers, ssl=context, server_hostname=stack.server_name) as r:
            return r.status, await r.text()


def status(stack: Stack, path: str, token: str | None = None) -> tuple[int, str]:
    try:
        return asyncio.run(_status(stack, path, token))
    except aiohttp.ClientConnectionError:
        return 0, ""


def test_metrics_need_an_allowed_token_over_the_charts_tls_and_the_probes_stay_open(stack: Stack) -> None:
    until(lambda: status(stack, "/readyz")[0] == 200, "the controller serving, ready", 60, 0.5)
    assert status(stack, "/healthz")[0] == 200  # the kubelet probes HTTPS without a token
    assert status(stack, "/metrics")[0] == 401
    assert status(stack, "/metrics", "not-a-token")[0] == 401
    assert status(stack, "/metrics", stack.tokens["stranger"])[0] == 403
    code, body = status(stack, "/metrics", stack.tokens["scraper"])
    assert code == 200
    assert "neuron_remediation_leader " in body
    # the refusals were counted (each series is shown from the start, so its value is what tells)
    counted = dict(re.findall(r'^neuron_metrics_auth_decisions_total\{verdict="(\w+)"\} (\S+)$', body, re.M))
    assert float(counted["forbidden"]) >= 1
    assert float(counted["unauthenticated"]) >= 2


def _check(stack: Stack, monkeypatch: pytest.MonkeyPatch, token: str, timeout: float, **env: str) -> ModuleType:
    """helm_test.py loaded afresh, set up as the chart's test pod is: its REMEDIATION_* variables (the port the
    process listens on), the scraper's token (or `token`) and the chart's CA as its projected volume holds them,
    and the test ServiceAccount's client."""
    from kubernetes import client

    credentials = stack.work / f"credentials-{token}"
    credentials.mkdir(exist_ok=True)
    (credentials / "token").write_text(stack.tokens[token])
    (credentials / "ca.crt").write_bytes((stack.tls / "ca.crt").read_bytes())
    assert stack.check_env["REMEDIATION_CREDENTIALS"] == "/var/run/neuron-metrics"
    wanted = {**stack.check_env, "REMEDIATION_PORT": str(stack.port), "REMEDIATION_CREDENTIALS": str(credentials)}
    for name, value in {**wanted, **env}.items():
        monkeypatch.setenv(name, value)
    helm_test = load_helm_test()
    monkeypatch.setattr(helm_test, "TIMEOUT", timeout)
    configuration = client.Configuration()
    configuration.host = stack.cp.server
    configuration.ssl_ca_cert = str(stack.cp.credentials.ca)
    configuration.api_key = {"authorization": "Bearer " + stack.tokens["tests"]}
    api = client.CoreV1Api(client.ApiClient(configuration))
    monkeypatch.setattr(helm_test, "core_api", lambda: api)
    return helm_test


def test_the_helm_check_passes_while_it_leads_and_fails_when_it_does_not_work(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the chart's check as the chart configures it: passes once the controller leads and has made a pass
    assert stack.check_env["REMEDIATION_NAMESPACE"] == NAMESPACE
    _check(stack, monkeypatch, "scraper", 90).test_remediation()
    assert "ok: the remediation controller answers, one replica leads and it acts" in capsys.readouterr().out
    # a token the API server vouches for but RBAC does not let read /metrics
    stranger = _check(stack, monkeypatch, "stranger", 0)
    with pytest.raises(stranger.CheckFailed, match="403"):
        stranger.test_remediation()
    # more replicas than run
    two = _check(stack, monkeypatch, "scraper", 0, REMEDIATION_REPLICAS="2")
    with pytest.raises(two.CheckFailed, match=r"1 remediation controller pods .* expected 2"):
        two.test_remediation()
    # the controller stopped: nothing answers at its pod's address
    processes.stop(stack.controller)
    assert stack.controller.returncode == 0
    down = _check(stack, monkeypatch, "scraper", 0)
    with pytest.raises(down.CheckFailed, match=re.escape("remediator-0: GET https://127.0.0.1")):
        down.test_remediation()
