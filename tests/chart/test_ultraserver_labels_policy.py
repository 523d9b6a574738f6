"""AWS's UltraServer labels (issue 26 item 2) under the chart's RBAC and admission policy, on a real
kube-apiserver: the services' own NodeLabeler, with a device plugin's or a DRA driver's pod-bound
token, applies its node's labels, changes and removes them, and leaves every other label alone; the
same token cannot label another node, set a label outside the prefix, taint its node, or do anything
when it is bound to no pod."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from typing import Any

import pytest
from chart import admission
from chart.test_chart import refusal, render, sets
from simcluster.controlplane import ControlPlane, private_control_plane

from neuron_common.kube import Api
from neuron_common.node_labels import NodeLabeler
from neuron_model.ultraserver import LABEL_PREFIX, LABELS_FIELD_MANAGER, node_id_label, server_id_label

pytestmark = pytest.mark.integration  # starts external processes: make integration

PLUGIN = "neuron-helm-chart-device-plugin"
DRA = "neuron-helm-chart-dra-driver"
POLICY = "neuron-helm-chart-ultraserver-labels"
MERGE = "application/merge-patch+json"
SERVER = "00c0ffee12345678"
PAIR = "0badcafe00000001"


@pytest.fixture(scope="module")
def apiserver() -> Iterator[ControlPlane]:
    with private_control_plane("us-labels-cp-") as cp:
        yield cp


async def _token(admin: Api, account: str, node: str | None) -> str:
    """A token of `account`, bound to a pod on `node` as the kubelet's projected tokens are, or to nothing."""
    spec: dict[str, Any] = {"expirationSeconds": 600}
    if node is not None:
        pod = await admin.create(
            "/api/v1/namespaces/kube-system/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"generateName": f"{account}-"},
                "spec": {"nodeName": node, "serviceAccountName": account, "containers": [{"name": "c", "image": "x"}]},
            },
        )
        ref = {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        spec["boundObjectRef"] = ref
    answer = await admin.create(
        f"/api/v1/namespaces/kube-system/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(answer["status"]["token"])


async def _scenario(cp: ControlPlane) -> dict[str, Any]:
    admin = Api(cp.server, ssl_context=cp.credentials.ssl_context())
    docs = render(
        *sets(draDriver__enabled=True, devicePlugin__nodeSelector={"a": "dp"}, draDriver__nodeSelector={"a": "dra"})
    )
    context = ssl.create_default_context(cafile=str(cp.credentials.ca))
    apis: list[Api] = []

    def as_token(token: str) -> Api:
        api = Api(cp.server, ssl_context=context, authorization=lambda: f"Bearer {token}")
        apis.append(api)
        return api

    try:
        for doc in docs:
            if doc["kind"] in admission.PATHS and doc["metadata"]["name"] == POLICY:
                await admin.create(admission.PATHS[doc["kind"]], doc)
        for account in (PLUGIN, DRA):
            await admin.create(
                "/api/v1/namespaces/kube-system/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
            )
        for node in ("node-a", "node-b", "node-c"):
            await admin.create(
                "/api/v1/nodes",
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"zone": "a"}}},
            )
        plugin_a = as_token(await _token(admin, PLUGIN, "node-a"))
        dra_c = as_token(await _token(admin, DRA, "node-c"))
        stranger = as_token(await _token(admin, PLUGIN, None))

        def patch(api: Api, node: str, body: dict[str, Any]) -> Any:
            return api.request("PATCH", f"/api/v1/nodes/{node}", body=body, content_type=MERGE)

        await admission.until_enforced(
            lambda: patch(plugin_a, "node-b", {"metadata": {"labels": {server_id_label(4): SERVER}}}),
            "may not change node node-b",
        )

        desired = {server_id_label(4): SERVER, node_id_label(4): "1", server_id_label(2): PAIR}
        steps: list[dict[str, str]] = []

        async def label(api: Api, node: str) -> None:
            labeler = NodeLabeler(api, node, lambda: desired, field_manager=LABELS_FIELD_MANAGER)
            if not await labeler.apply(desired):
                raise AssertionError(f"the labeler on {node} was refused; see the log")

        await label(plugin_a, "node-a")
        steps.append((await admin.get("/api/v1/nodes/node-a"))["metadata"]["labels"])
        del desired[server_id_label(2)]  # a pair that is gone: its label goes, the rest stays
        desired[node_id_label(4)] = "2"
        await label(plugin_a, "node-a")
        steps.append((await admin.get("/api/v1/nodes/node-a"))["metadata"]["labels"])
        await label(dra_c, "node-c")
        steps.append((await admin.get("/api/v1/nodes/node-c"))["metadata"]["labels"])

        attempts = {
            "another node": patch(plugin_a, "node-b", {"metadata": {"labels": {server_id_label(4): SERVER}}}),
            "a label outside the prefix": patch(plugin_a, "node-a", {"metadata": {"labels": {"zone": "b"}}}),
            "removing a label outside the prefix": patch(plugin_a, "node-a", {"metadata": {"labels": {"zone": None}}}),
            "a taint": patch(
                plugin_a, "node-a", {"spec": {"taints": [{"key": "example.com/x", "effect": "NoSchedule"}]}}
            ),
            "an annotation": patch(plugin_a, "node-a", {"metadata": {"annotations": {"a": "b"}}}),
            "a token bound to no pod": patch(stranger, "node-a", {"metadata": {"labels": {server_id_label(4): "x"}}}),
            "the DRA driver on another node": patch(dra_c, "node-a", {"metadata": {"labels": {node_id_label(4): "0"}}}),
            "deleting its node": plugin_a.delete("/api/v1/nodes/node-a"),
        }
        outcomes = await admission.outcomes(attempts)
        return {"steps": steps, "outcomes": outcomes}
    finally:
        for api in apis:
            await api.close()
        await admin.close()


def test_node_agents_label_only_their_own_node_under_the_prefix(apiserver: ControlPlane) -> None:
    result = asyncio.run(_scenario(apiserver))
    first, second, dra = result["steps"]
    assert first == {"zone": "a", server_id_label(4): SERVER, node_id_label(4): "1", server_id_label(2): PAIR}
    # the applied set as it is now: the pair's label removed, the node id changed, `zone` untouched
    assert second == {"zone": "a", server_id_label(4): SERVER, node_id_label(4): "2"}
    assert dra == second  # the DRA driver's account labels its own node the same way
    outcomes = result["outcomes"]
    assert set(outcomes.values()) == {o for o in outcomes.values() if o.startswith("403")}, outcomes
    assert "may not change node node-b" in outcomes["another node"]
    assert "may not change node node-a" in outcomes["the DRA driver on another node"]
    for name in ("a label outside the prefix", "removing a label outside the prefix", "a taint", "an annotation"):
        assert "only the labels under neuron.amazonaws.com/ultraserver- of its Node" in outcomes[name], name
    assert "names none" in outcomes["a token bound to no pod"]
    assert "cannot delete resource" in outcomes["deleting its node"]  # RBAC: a patch, nothing more


def test_no_label_writers_without_the_value_and_only_the_enabled_agents() -> None:
    assert not [d for d in render(*sets(ultraServer__nodeLabels=False)) if d["metadata"]["name"] == POLICY]
    (binding,) = [d for d in render() if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == POLICY]
    assert [s["name"] for s in binding["subjects"]] == [PLUGIN]
    (plugin,) = [d for d in render() if d["kind"] == "DaemonSet" and d["metadata"]["name"] == PLUGIN]
    container = plugin["spec"]["template"]["spec"]["containers"][0]
    assert "--ultraserver-labels" in container["args"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
    (off,) = [
        d
        for d in render(*sets(ultraServer__nodeLabels=False))
        if d["kind"] == "DaemonSet" and d["metadata"]["name"] == PLUGIN
    ]
    assert "--ultraserver-labels" not in off["spec"]["template"]["spec"]["containers"][0]["args"]
    # the policy's prefix is the model's, where the labels' names are made
    (policy,) = [d for d in render() if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == POLICY]
    (prefix,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "prefix"]
    assert prefix == f"'{LABEL_PREFIX}'"


def test_the_runtime_variables_are_the_device_plugins_flag_off_by_default() -> None:
    """ultraServer.runtimeEnvNodes (issue 26 item 3): --ultraserver-env, only when set, only 0, 2 or 4."""

    def args(*values: str) -> list[str]:
        (plugin,) = [d for d in render(*values) if d["kind"] == "DaemonSet" and d["metadata"]["name"] == PLUGIN]
        return [a for a in plugin["spec"]["template"]["spec"]["containers"][0]["args"] if "ultraserver-env" in a]

    assert args() == []
    assert args(*sets(ultraServer__runtimeEnvNodes=4)) == ["--ultraserver-env=4"]
    assert args(*sets(ultraServer__runtimeEnvNodes=2)) == ["--ultraserver-env=2"]
    assert "value must be one of 0, 2, 4" in refusal(*sets(ultraServer__runtimeEnvNodes=3))
