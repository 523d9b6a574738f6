"""The test cluster's helpers: reading the kubelet's status period from the configuration up.sh
writes, in the Go duration format the kubelet takes; and the suites' reads in process, held to what
`kubectl get -o json` prints from a real kube-apiserver (tests/simcluster's)."""

from __future__ import annotations

import base64
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cluster_access
import pytest
import yaml
from cluster_access import go_duration
from simcluster.controlplane import ControlPlane, private_control_plane

from neuron_common.kube import ApiError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2s", 2.0), ("10s", 10.0), ("1m0s", 60.0), ("1h2m3s", 3723.0), ("500ms", 0.5), ("1.5s", 1.5), ("250us", 250e-6)],
)
def test_go_durations_as_the_kubelet_writes_them(text: str, seconds: float) -> None:
    assert go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "2", "s", "2x", "2 s", "-2s", "2s3", "ms"])
def test_anything_else_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="not a Go duration"):
        go_duration(text)


def test_up_sh_sets_the_period_the_helper_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The value up.sh writes into the kubelet's configuration, and the kubelet's default without it."""
    up = (cluster_access.REPO / "tests" / "cluster" / "up.sh").read_text()
    (written,) = [
        line.split(":", 1)[1].strip() for line in up.splitlines() if line.startswith("nodeStatusUpdateFrequency:")
    ]
    monkeypatch.setattr(cluster_access, "CLUSTER_DIR", tmp_path)
    (tmp_path / "kubelet").mkdir()
    config = tmp_path / "kubelet" / "config.yaml"
    config.write_text(f"kind: KubeletConfiguration\nnodeStatusUpdateFrequency: {written}\n")
    assert cluster_access.node_status_update_period() == go_duration(written) < 10.0
    config.write_text("kind: KubeletConfiguration\n")
    assert cluster_access.node_status_update_period() == 10.0


# --- reads in this process, against a real kube-apiserver ---------------------------------------

KUBECTL = str(cluster_access.BIN / "kubectl")


@pytest.fixture(scope="module")
def apiserver() -> Iterator[ControlPlane]:
    with private_control_plane("cluster-access-cp-") as cp:
        subprocess.run(
            [KUBECTL, "--kubeconfig", str(cp.kubeconfig), "apply", "-f", "-"], input=json.dumps(OBJECTS),
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        yield cp


OBJECTS = {
    "apiVersion": "v1",
    "kind": "List",
    "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "reads"}},
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"pool": "a"}}},
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2", "labels": {"pool": "b"}}},
        *(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n, "namespace": ns, "labels": {"app": a}}}
            for n, ns, a in [("c1", "reads", "x"), ("c2", "reads", "y"), ("c3", "default", "x")]
        ),
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "ds1", "namespace": "reads"},
         "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}},
                  "spec": {"containers": [{"name": "c", "image": "i"}]}}}},
    ],
}  # fmt: skip


def kubectl_json(cp: ControlPlane, *args: str) -> Any:
    done = subprocess.run(
        [KUBECTL, "--kubeconfig", str(cp.kubeconfig), "get", *args, "-o", "json"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return json.loads(done.stdout)


def names(listed: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in listed["items"])


@pytest.mark.integration
@pytest.mark.parametrize(
    ("kubectl_args", "read_args", "read_kwargs"),
    [
        (("node", "n1"), ("node", "n1"), {}),
        (("no", "n2"), ("no", "n2"), {}),
        (("nodes", "-l", "pool=b"), ("nodes",), {"selector": "pool=b"}),
        (("ds", "-n", "reads", "ds1"), ("ds", "ds1"), {"namespace": "reads"}),
        (("daemonsets.apps", "-n", "reads"), ("daemonsets.apps",), {"namespace": "reads"}),
        (("cm",), ("cm",), {}),
        (("configmaps", "-A", "-l", "app=x"), ("configmaps",), {"namespace": None, "selector": "app=x"}),
        (("configmap", "-n", "reads", "--field-selector", "metadata.name=c2"), ("configmap",),
         {"namespace": "reads", "field_selector": "metadata.name=c2"}),
    ],
)  # fmt: skip
def test_a_read_in_process_is_what_kubectl_get_prints(
    apiserver: ControlPlane, kubectl_args: tuple[str, ...], read_args: tuple[str, ...], read_kwargs: dict[str, Any]
) -> None:
    reader = cluster_access.ResourceReader(apiserver.kubeconfig)
    expected = kubectl_json(apiserver, *kubectl_args)
    got = reader.get(*read_args, **read_kwargs)
    if expected["kind"] == "List":  # kubectl prints a list as a List; the API server names its kind
        assert got["kind"].endswith("List")
        assert names(got) == names(expected) != []
        assert [o["metadata"]["uid"] for o in sorted(got["items"], key=lambda o: o["metadata"]["name"])] == [
            o["metadata"]["uid"] for o in sorted(expected["items"], key=lambda o: o["metadata"]["name"])
        ]
    else:
        assert got == expected


@pytest.mark.integration
def test_a_missing_object_or_resource_fails_as_kubectl_does_and_a_new_crd_is_found(apiserver: ControlPlane) -> None:
    reader = cluster_access.ResourceReader(apiserver.kubeconfig)
    with pytest.raises(AssertionError, match=r"GET /api/v1/nodes/absent: 404 nodes \"absent\" not found"):
        reader.get("node", "absent")
    with pytest.raises(AssertionError, match=r'the server doesn\'t have a resource type "widgets"'):
        reader.get("widgets")
    # a CRD made after the first discovery (a chart's, installed by a test) is found by its names
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Cluster",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wg"]},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
    }  # fmt: skip
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}}
    apply = [KUBECTL, "--kubeconfig", str(apiserver.kubeconfig), "apply", "-f", "-"]
    subprocess.run(apply, input=json.dumps(crd), capture_output=True, text=True, check=True, timeout=60)
    subprocess.run(
        [KUBECTL, "--kubeconfig", str(apiserver.kubeconfig), "wait", "--for=condition=Established",
         "crd/widgets.example.com", "--timeout=60s"], capture_output=True, check=True, timeout=90,
    )  # fmt: skip

    def created() -> bool:  # the API server serves the new kind a moment after Established
        done = subprocess.run(apply, input=json.dumps(widget), capture_output=True, text=True, timeout=60, check=False)
        return done.returncode == 0

    cluster_access.eventually(created, "the widget created", 60)
    for alias in ("widgets", "widget", "wg", "Widget"):
        assert reader.get(alias, "w1") == kubectl_json(apiserver, "widgets", "w1")


@pytest.mark.integration
def test_a_kubeconfig_with_inline_credentials_reads_the_same(apiserver: ControlPlane, tmp_path: Path) -> None:
    """The data fields kubeadm's and EKS's kubeconfigs carry, instead of up.sh's file paths."""
    creds = apiserver.credentials
    inline = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "s", "cluster": {"server": apiserver.server,
                      "certificate-authority-data": base64.b64encode(creds.ca.read_bytes()).decode()}}],
        "users": [{"name": "u", "user": {
            "client-certificate-data": base64.b64encode(creds.client_cert.read_bytes()).decode(),
            "client-key-data": base64.b64encode(creds.client_key.read_bytes()).decode()}}],
        "contexts": [{"name": "c", "context": {"cluster": "s", "user": "u"}}],
    }  # fmt: skip
    path = tmp_path / "inline.kubeconfig"
    path.write_text(yaml.safe_dump(inline))
    reader = cluster_access.ResourceReader(path)
    assert reader.get("node", "n1") == kubectl_json(apiserver, "node", "n1")


def test_a_kubeconfig_whose_server_is_not_https_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plain.kubeconfig"
    path.write_text(
        yaml.safe_dump({
            "current-context": "c",
            "clusters": [{"name": "s", "cluster": {"server": "http://127.0.0.1:8080"}}],
            "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "c", "context": {"cluster": "s", "user": "u"}}],
        })
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"the server 'http://127.0.0.1:8080' is not https://host\[:port\]"):
        cluster_access.ApiServer(path)


@pytest.mark.integration
def test_reads_from_two_threads_at_once_each_get_their_answer(apiserver: ControlPlane) -> None:
    """The migration e2e test samples allocatable from a thread while the test itself reads: one
    reader, used from both (and from the main thread, whose client is kept), must answer each."""
    reader = cluster_access.ResourceReader(apiserver.kubeconfig)
    errors: list[BaseException] = []

    def read_many(name: str) -> None:
        try:
            for _ in range(20):
                assert reader.get("node", name)["metadata"]["name"] == name
        except BaseException as e:  # handed to the test's thread, which fails on it
            errors.append(e)

    threads = [threading.Thread(target=read_many, args=(n,)) for n in ("n1", "n2")]
    for t in threads:
        t.start()
    read_many("n1")
    for t in threads:
        t.join(120)
    assert errors == []


@pytest.mark.integration
def test_main_thread_reads_keep_one_client_and_one_unanswered_read_is_tried_once_more(
    apiserver: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suites poll every half second: their reads share a client (and its connection), and a read
    that got no answer at all (a kept connection the server closed) is sent once more on a fresh one.
    An answer, a NotFound included, is final; a second read without one fails as the first would."""
    api = cluster_access.ApiServer(apiserver.kubeconfig)
    assert api.get("/api/v1/nodes/n1")["metadata"]["name"] == "n1"
    kept = api._shared.session
    assert api.get("/api/v1/nodes/n2")["metadata"]["name"] == "n2"
    assert api._shared.session is kept
    assert not kept.closed

    real = api._shared.request
    sent: list[str] = []
    unanswered = [1]  # how many reads, from now on, get no answer

    async def request(method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        sent.append(path)
        if unanswered[0] > 0:
            unanswered[0] -= 1
            raise ApiError(0, f"{method} {path}: ServerDisconnectedError: Server disconnected")
        return await real(method, path, **kwargs)

    monkeypatch.setattr(api._shared, "request", request)
    assert api.get("/api/v1/nodes/n2")["metadata"]["name"] == "n2"
    assert sent == ["/api/v1/nodes/n2", "/api/v1/nodes/n2"]
    assert kept.closed
    assert api._shared.session is not kept

    sent.clear()
    with pytest.raises(AssertionError, match=r"GET /api/v1/nodes/absent: 404 .*not found"):
        api.get("/api/v1/nodes/absent")
    assert sent == ["/api/v1/nodes/absent"]

    sent.clear()
    unanswered[0] = 2
    with pytest.raises(AssertionError, match=r"GET /api/v1/nodes/n1: 0 .*ServerDisconnectedError"):
        api.get("/api/v1/nodes/n1")
    assert sent == ["/api/v1/nodes/n1", "/api/v1/nodes/n1"]
