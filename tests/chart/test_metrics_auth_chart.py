"""The chart's protected /metrics (issue 24 item 3): one value per component turns on TLS with the
chart's certificate and token review; the monitors scrape with the scraper's token against the
chart's CA; nothing is granted while every value is off. The same objects on a real API server
with a real Prometheus: tests/integration/test_metrics_auth.py."""

from __future__ import annotations

import base64
import subprocess
from typing import Any

import pytest
from chart.test_chart import container, daemonset, of_kind, refusal, render
from chart_tools import sets

from neuron_common.config import MetricsSecurity
from neuron_remediation import config as remediation_config

pytestmark = pytest.mark.integration  # starts external processes (helm): make integration

AGENTS = {
    "devicePlugin": "device-plugin",
    "draDriver": "dra-driver",
    "nodeMetrics": "node-metrics",
    "npd": "problem-detector",
}
FULL = "neuron-helm-chart"
SERVER_NAME = f"{FULL}-metrics.kube-system.svc"
TLS_DIR = "/etc/neuron/metrics-tls"


def all_secure() -> list[dict[str, Any]]:
    values: dict[str, Any] = {f"{key}__secureMetrics": True for key in AGENTS}
    return render(
        *sets(
            **values,
            draDriver__enabled=True,
            devicePlugin__nodeSelector={"allocator": "device-plugin"},
            draDriver__nodeSelector={"allocator": "dra"},
            scheduler__enabled=True,
            scheduler__extender__secureMetrics=True,
            remediation__enabled=True,
            remediation__secureMetrics=True,
            nodeMetrics__monitoring__force=True,
            metricsAuth__readers=[{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}],
        )
    )


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return doc


def remediation_controller(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return named(docs, "Deployment", f"{FULL}-remediation-controller")


def assert_scraped_as_the_scraper(endpoint: dict[str, Any]) -> None:
    """A monitor's endpoint scrapes over TLS, verifying the chart's CA and name, with the scraper's token."""
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {
        "serverName": SERVER_NAME,
        "ca": {"secret": {"name": f"{FULL}-metrics-tls", "key": "ca.crt"}},
    }
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": f"{FULL}-metrics-scraper", "key": "token"},
    }


def test_each_agent_serves_tls_with_token_review_and_probes_over_https() -> None:
    docs = all_secure()
    for component in AGENTS.values():
        ds = daemonset(docs, component)
        pod, c = ds["spec"]["template"]["spec"], container(ds)
        assert [a for a in c["args"] if a.startswith(("--metrics-auth", "--tls-"))] == [
            "--metrics-auth=kubernetes",
            f"--tls-cert-file={TLS_DIR}/tls.crt",
            f"--tls-key-file={TLS_DIR}/tls.key",
        ], component
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert c[probe]["httpGet"]["scheme"] == "HTTPS", (component, probe)
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "metrics-tls"]
        assert (mount["mountPath"], mount["readOnly"]) == (TLS_DIR, True)
        (volume,) = [v for v in pod["volumes"] if v["name"] == "metrics-tls"]
        assert volume["secret"]["secretName"] == f"{FULL}-metrics-tls"
        # it has a token to review its callers' with: automounted, or mounted for this container
        token_mounted = any(
            m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount" for m in c["volumeMounts"]
        )
        assert token_mounted or pod.get("automountServiceAccountToken", True), component


def test_off_by_default_with_nothing_granted() -> None:
    docs = render()
    for component in ("device-plugin", "node-metrics", "problem-detector"):
        c = container(daemonset(docs, component))
        assert not [a for a in c["args"] if a.startswith(("--metrics-auth", "--tls-"))]
        assert "scheme" not in c["livenessProbe"]["httpGet"]
    # the remediation controller, installed, stays plain HTTP too
    docs = render(*sets(remediation__enabled=True), "--api-versions", "monitoring.coreos.com/v1")
    controller = remediation_controller(docs)
    c = controller["spec"]["template"]["spec"]["containers"][0]
    assert not [a for a in c["args"] if a.startswith(("--metrics-auth", "--tls-"))]
    assert "scheme" not in c["readinessProbe"]["httpGet"]
    assert "volumes" not in controller["spec"]["template"]["spec"]
    (endpoint,) = named(docs, "ServiceMonitor", f"{FULL}-remediation-controller")["spec"]["endpoints"]
    assert not {"scheme", "tlsConfig", "authorization"} & set(endpoint)
    names = {d["metadata"]["name"] for d in docs}
    assert not {
        n for n in names if "metrics-auth" in n or "metrics-reader" in n or "metrics-tls" in n or "scraper" in n
    }
    # the exporter still has no token at all
    assert daemonset(docs, "node-metrics")["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_only_the_protected_components_may_review_tokens_and_only_the_readers_may_scrape() -> None:
    docs = all_secure()
    delegation = named(docs, "ClusterRoleBinding", f"{FULL}-metrics-auth")
    assert delegation["roleRef"]["name"] == "system:auth-delegator"
    assert {s["name"] for s in delegation["subjects"]} == {
        f"{FULL}-{c}" for c in [*AGENTS.values(), "scheduler-extender", "remediation-controller"]
    }
    assert named(docs, "ClusterRole", f"{FULL}-metrics-reader")["rules"] == [
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}
    ]
    readers = named(docs, "ClusterRoleBinding", f"{FULL}-metrics-reader")["subjects"]
    assert readers == [
        {"kind": "ServiceAccount", "name": f"{FULL}-metrics-scraper", "namespace": "kube-system"},
        {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"},
    ]
    # one component on grants only that one
    one = render(*sets(npd__secureMetrics=True))
    assert [s["name"] for s in named(one, "ClusterRoleBinding", f"{FULL}-metrics-auth")["subjects"]] == [
        f"{FULL}-problem-detector"
    ]
    assert container(daemonset(one, "node-metrics"))["livenessProbe"]["httpGet"].get("scheme") is None


def test_the_monitors_scrape_with_the_scrapers_token_against_the_charts_ca_and_name() -> None:
    docs = all_secure()
    scraper_token = named(docs, "Secret", f"{FULL}-metrics-scraper")
    assert scraper_token["type"] == "kubernetes.io/service-account-token"
    assert scraper_token["metadata"]["annotations"] == {"kubernetes.io/service-account.name": f"{FULL}-metrics-scraper"}
    for component in ("node-metrics", "dra-driver"):
        (endpoint,) = named(docs, "ServiceMonitor", f"{FULL}-{component}")["spec"]["endpoints"]
        assert_scraped_as_the_scraper(endpoint)
    (extender,) = named(docs, "ServiceMonitor", f"{FULL}-scheduler-extender")["spec"]["endpoints"]
    assert extender["authorization"]["credentials"]["name"] == f"{FULL}-metrics-scraper"
    assert "--metrics-auth=kubernetes" in container(named(docs, "Deployment", f"{FULL}-scheduler-extender"))["args"]


def test_the_generated_certificate_is_for_the_monitors_server_name_and_signed_by_the_ca(tmp_path: Any) -> None:
    secret = named(all_secure(), "Secret", f"{FULL}-metrics-tls")
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (tmp_path / key).write_bytes(base64.b64decode(secret["data"][key]))
    san = subprocess.run(
        ["openssl", "x509", "-in", tmp_path / "tls.crt", "-noout", "-ext", "subjectAltName"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert f"DNS:{SERVER_NAME}" in san
    ca, cert = tmp_path / "ca.crt", tmp_path / "tls.crt"
    verified = subprocess.run(["openssl", "verify", "-CAfile", ca, cert], capture_output=True, text=True, check=False)
    assert verified.returncode == 0, verified.stderr


def test_contradictory_and_malformed_values_are_refused() -> None:
    assert "scheduler.extender.secureMetrics needs scheduler.extender.tls.enabled" in refusal(
        *sets(scheduler__enabled=True, scheduler__extender__secureMetrics=True, scheduler__extender__tls__enabled=False)
    )
    assert "secureMetrics" in refusal(*sets(nodeMetrics__secureMetrics="yes"))
    assert "readers" in refusal(
        *sets(nodeMetrics__secureMetrics=True, metricsAuth__readers=[{"kind": "ServiceAccount"}])
    )


def test_helm_tests_metrics_check_reads_a_protected_exporter_as_the_scraper() -> None:
    """With nodeMetrics.secureMetrics the pod of the metrics check gets the scraper's token and the chart's CA,
    and only those two keys: never the serving key that sits beside the CA in the TLS Secret."""
    docs = render(*sets(nodeMetrics__secureMetrics=True, tests__enabled=True))
    (pod,) = [d for d in docs if d["kind"] == "Pod" and d["metadata"]["name"] == f"{FULL}-tests-components"]
    (c,) = pod["spec"]["containers"]
    assert {"name": "NODE_METRICS_CREDENTIALS", "value": "/var/run/neuron-metrics"} in c["env"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "metrics-credentials"]
    assert mount == {"name": "metrics-credentials", "mountPath": "/var/run/neuron-metrics", "readOnly": True}
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "metrics-credentials"]
    sources = [s["secret"] for s in volume["projected"]["sources"]]
    assert sources == [
        {"name": f"{FULL}-metrics-scraper", "items": [{"key": "token", "path": "token"}]},
        {"name": f"{FULL}-metrics-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]},
    ]
    # without it, plain HTTP and nothing mounted
    (plain,) = [
        d
        for d in render(*sets(tests__enabled=True))
        if d["kind"] == "Pod" and d["metadata"]["name"] == f"{FULL}-tests-components"
    ]
    assert "NODE_METRICS_CREDENTIALS" not in {e["name"] for e in plain["spec"]["containers"][0]["env"]}
    assert [v["name"] for v in plain["spec"]["volumes"]] == ["tests"]


def test_the_remediation_controller_serves_tls_with_token_review_as_the_agents_do(tmp_path: Any) -> None:
    """remediation.secureMetrics: the chart's certificate in the controller's namespace, the same flags, mount and
    HTTPS probes as a node agent's, which the controller's own parser takes; the auth-delegator binding names it;
    its monitor scrapes as the scraper against the chart's CA and name, with both Secrets beside it."""
    docs = render(*sets(remediation__enabled=True, remediation__secureMetrics=True, tests__enabled=False),
                  "--api-versions", "monitoring.coreos.com/v1")  # fmt: skip
    d = remediation_controller(docs)
    namespace = d["metadata"]["namespace"]
    pod = d["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert [a for a in c["args"] if a.startswith(("--metrics-auth", "--tls-"))] == [
        "--metrics-auth=kubernetes",
        f"--tls-cert-file={TLS_DIR}/tls.crt",
        f"--tls-key-file={TLS_DIR}/tls.key",
    ]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["scheme"] == "HTTPS", probe
    assert c["volumeMounts"] == [{"name": "metrics-tls", "mountPath": TLS_DIR, "readOnly": True}]
    assert pod["volumes"] == [
        {"name": "metrics-tls", "secret": {"secretName": f"{FULL}-metrics-tls", "defaultMode": 0o400}}
    ]
    # it reviews with its own token, automounted (it talks to the API server anyway)
    assert pod.get("automountServiceAccountToken", True)
    # the controller's own parser: protected /metrics with the mounted pair
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).touch()
    args = [a.replace(TLS_DIR, str(tmp_path)) for a in c["args"]]
    parsed = remediation_config.parse(args, {"POD_NAMESPACE": namespace, "POD_NAME": "r-0"})
    assert parsed.metrics_security == MetricsSecurity(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    # only it may review tokens; the scraper, its token and the certificate sit in its namespace
    assert [s["name"] for s in named(docs, "ClusterRoleBinding", f"{FULL}-metrics-auth")["subjects"]] == [
        f"{FULL}-remediation-controller"
    ]
    assert named(docs, "ClusterRoleBinding", f"{FULL}-metrics-auth")["roleRef"]["name"] == "system:auth-delegator"
    for kind, name in (("Secret", f"{FULL}-metrics-tls"), ("Secret", f"{FULL}-metrics-scraper"),
                       ("ServiceAccount", f"{FULL}-metrics-scraper")):  # fmt: skip
        assert named(docs, kind, name)["metadata"]["namespace"] == namespace, (kind, name)
    monitor = named(docs, "ServiceMonitor", f"{FULL}-remediation-controller")
    assert monitor["metadata"]["namespace"] == namespace
    (endpoint,) = monitor["spec"]["endpoints"]
    assert_scraped_as_the_scraper(endpoint)
    # a PodMonitor the same
    pods = render(*sets(remediation__enabled=True, remediation__secureMetrics=True,
                        nodeMetrics__monitoring__kind="PodMonitor"), "--api-versions", "monitoring.coreos.com/v1")  # fmt: skip
    (pod_endpoint,) = named(pods, "PodMonitor", f"{FULL}-remediation-controller")["spec"]["podMetricsEndpoints"]
    assert {k: pod_endpoint[k] for k in ("scheme", "tlsConfig", "authorization")} == {
        k: endpoint[k] for k in ("scheme", "tlsConfig", "authorization")
    }
    # the value is the controller's alone: no node agent is switched with it
    assert container(daemonset(docs, "node-metrics"))["livenessProbe"]["httpGet"].get("scheme") is None


def test_helm_tests_remediation_check_reads_a_protected_controller_as_the_scraper() -> None:
    docs = render(*sets(remediation__enabled=True, remediation__secureMetrics=True, tests__enabled=True))
    (pod,) = [d for d in docs if d["kind"] == "Pod" and d["metadata"]["name"] == f"{FULL}-tests-components"]
    (c,) = pod["spec"]["containers"]
    assert "remediation" in c["command"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["REMEDIATION_CREDENTIALS"] == "/var/run/neuron-metrics"
    assert "NODE_METRICS_CREDENTIALS" not in env  # the exporter is not protected here
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "metrics-credentials"]
    assert [s["secret"] for s in volume["projected"]["sources"]] == [
        {"name": f"{FULL}-metrics-scraper", "items": [{"key": "token", "path": "token"}]},
        {"name": f"{FULL}-metrics-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]},
    ]
    # the CA it projects is in its own namespace
    assert named(docs, "Secret", f"{FULL}-metrics-tls")["metadata"]["namespace"] == pod["metadata"]["namespace"]
