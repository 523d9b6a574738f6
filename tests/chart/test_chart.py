"""The chart, rendered by the real Helm 4 and checked by the real chart-testing and kubectl-validate:
toggles, labels, security contexts, RBAC, images, placement, monitoring gates, the values schema
and every contradiction the chart refuses."""

from __future__ import annotations

import copy
import functools
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
import yaml_streams
from chart_tools import DRIVER, KMM_API, NFD_API, NODE_ENABLEMENT_GROUPS, NODE_ENABLEMENT_VARIANTS, chart_tools, sets

from neuron_node_metrics.catalogue import Naming

pytestmark = pytest.mark.integration  # starts external processes: make integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "neuron-helm-chart"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
HELM = str(REPO / ".venv" / "bin" / "helm")
COMPONENTS = {"devicePlugin": "device-plugin", "nodeMetrics": "node-metrics", "npd": "problem-detector"}
MONITORING_API = ["--api-versions", "monitoring.coreos.com/v1"]
OPENSHIFT_API = ["--api-versions", "security.openshift.io/v1"]


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([HELM, *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


@functools.cache
def _render(args: tuple[str, ...]) -> tuple[dict[str, Any], ...]:
    out = helm("template", "neuron-helm-chart", str(CHART), "--namespace", "kube-system", *args).stdout
    return tuple(d for d in yaml_streams.load_all(out) if d)


# Release-scoped names in the release namespace (`objectNames: release`), which the tests built on render() name
# (`neuron-helm-chart-<component>` in kube-system). First, so a test's own --set-json of it wins; AWS's names, the
# default, are test_object_names.py's.
RELEASE_NAMES = ("--set-json", 'objectNames="release"')


def render(*args: str) -> list[dict[str, Any]]:
    return list(_render((*RELEASE_NAMES, *args)))


def of_kind(docs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def by_component(docs: Iterable[dict[str, Any]], component: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component]


def daemonset(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    (ds,) = [d for d in of_kind(docs, "DaemonSet") if d["metadata"]["name"].endswith(component)]
    return ds


def container(ds: dict[str, Any]) -> dict[str, Any]:
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    return c


def refusal(*args: str) -> str:
    result = helm("template", "x", str(CHART), *args, check=False)
    assert result.returncode != 0, f"helm template {' '.join(args)} should have been refused"
    return result.stderr


# --- toggles ---------------------------------------------------------------------------------


def test_defaults_render_every_component() -> None:
    docs = render()
    assert {d["metadata"]["name"] for d in of_kind(docs, "DaemonSet")} == {
        "neuron-helm-chart-device-plugin",
        "neuron-helm-chart-node-metrics",
        "neuron-helm-chart-problem-detector",
    }


@pytest.mark.parametrize("disabled", COMPONENTS)
def test_disabling_a_component_removes_every_object_it_owns(disabled: str) -> None:
    component = COMPONENTS[disabled]
    before = by_component(render(*MONITORING_API), component)
    assert len(before) >= 2, f"{component} should own several objects by default"
    after = render(*MONITORING_API, *sets(**{f"{disabled}__enabled": False}))
    assert by_component(after, component) == []
    tests = [p for p in of_kind(after, "Pod") if p["metadata"]["name"].endswith(tuple(_checks_of(disabled)))]
    assert tests == [], "a disabled component's helm test must be left out"
    others = {c for k, c in COMPONENTS.items() if k != disabled}
    assert others <= {d["metadata"]["labels"].get("app.kubernetes.io/component") for d in after}


def _checks_of(key: str) -> list[str]:
    return {"devicePlugin": ["-capacity", "-allocation"], "nodeMetrics": ["-metrics"], "npd": ["-health"]}[key]


def test_disabling_tests_removes_test_pods_and_their_rbac() -> None:
    docs = render(*sets(tests__enabled=False))
    assert of_kind(docs, "Pod") == []
    assert by_component(docs, "tests") == []


# --- labels ----------------------------------------------------------------------------------

STANDARD_LABELS = {
    "app.kubernetes.io/name": "neuron-helm-chart",
    "app.kubernetes.io/instance": "neuron-helm-chart",
    "app.kubernetes.io/managed-by": "Helm",
    "app.kubernetes.io/part-of": "neuron-helm-chart",
}


@pytest.mark.parametrize("names", ["release", "aws"])
@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_every_object_carries_the_standard_labels(values: Path, names: str) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for doc in render("-f", str(values), *MONITORING_API, *NFD_API, *KMM_API, *OPENSHIFT_API, *sets(objectNames=names)):
        labels = doc["metadata"]["labels"]
        for key, value in STANDARD_LABELS.items():
            assert labels.get(key) == value, f"{doc['kind']}/{doc['metadata']['name']}: {key}"
        assert labels["helm.sh/chart"] == f"neuron-helm-chart-{chart['version']}"
        assert labels["app.kubernetes.io/version"] == chart["appVersion"]


def test_selectors_use_only_stable_labels_and_match_the_pods() -> None:
    docs = render()
    for ds in of_kind(docs, "DaemonSet"):
        selector = ds["spec"]["selector"]["matchLabels"]
        assert set(selector) == {"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component"}
        assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    (svc,) = of_kind(docs, "Service")
    assert svc["spec"]["selector"] == daemonset(docs, "node-metrics")["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["clusterIP"] == "None"


def test_common_labels_reach_every_object() -> None:
    for doc in render(*sets(commonLabels={"team": "ml-platform"})):
        assert doc["metadata"]["labels"]["team"] == "ml-platform"


def test_common_labels_are_templates() -> None:
    docs = render(*sets(commonLabels={"owner": "{{ .Release.Name }}-{{ .Release.Namespace }}"}))
    pod_labels = [d["spec"]["template"]["metadata"]["labels"] for d in of_kind(docs, "DaemonSet")]
    for labels in [d["metadata"]["labels"] for d in docs] + pod_labels:
        assert labels["owner"] == "neuron-helm-chart-kube-system"


# --- security --------------------------------------------------------------------------------


@pytest.mark.parametrize("simulation", [False, True])
def test_security_contexts_are_the_documented_minimum(simulation: bool) -> None:
    docs = render(*sets(simulation__enabled=simulation))
    for component in COMPONENTS.values():
        ds = daemonset(docs, component)
        pod = ds["spec"]["template"]["spec"]
        sc = container(ds)["securityContext"]
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert sc["readOnlyRootFilesystem"] is True
        # the API server refuses a privileged container that forbids escalation
        assert sc["allowPrivilegeEscalation"] is sc.get("privileged", False)
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert sc["runAsUser"] == 0  # documented: root-only kubelet directories, /dev/kmsg
        assert pod["priorityClassName"] == "system-node-critical"
        assert pod.get("hostNetwork") is not True
        assert pod.get("hostPID") is not True
        if component == "problem-detector":
            assert sc["capabilities"]["add"] == ["SYSLOG"]
            assert sc.get("privileged", False) is (not simulation), "privileged only for /dev/kmsg on real nodes"
        else:
            assert "add" not in sc["capabilities"]
            assert "privileged" not in sc
            assert pod["automountServiceAccountToken"] is False


def test_kmsg_privilege_can_be_turned_off() -> None:
    sc = container(daemonset(render(*sets(npd__kmsgPrivileged=False)), "problem-detector"))["securityContext"]
    assert "privileged" not in sc
    assert sc["allowPrivilegeEscalation"] is False


PLUGIN_ONLY = ["-f", str(CHART / "ci" / "device-plugin-only-values.yaml")]


@pytest.mark.parametrize(
    "args",
    [[], PLUGIN_ONLY, [*PLUGIN_ONLY, *sets(devicePlugin__kmsgPrivileged=False)], *(["-f", str(v)] for v in CI_VALUES)],
    ids=["defaults", "plugin-only", "plugin-only-unprivileged", *(v.name for v in CI_VALUES)],
)
def test_no_container_is_privileged_yet_forbids_escalation(args: list[str]) -> None:
    """The API server's own rule (kubectl-validate checks only the schema): it refuses such a Pod."""
    for ds in of_kind(render(*args), "DaemonSet"):
        sc = container(ds)["securityContext"]
        if sc.get("privileged"):
            assert sc.get("allowPrivilegeEscalation", True) is True, ds["metadata"]["name"]


# --- the device plugin's health sources -------------------------------------------------------

VERDICTS = "/var/lib/neuron-problem-detector/verdicts"


def _host_path_of(ds: dict[str, Any], path: str) -> str | None:
    """The host path a container path resolves to through the pod's hostPath mounts (None: not on the host)."""
    volumes = {v["name"]: v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"] if "hostPath" in v}
    for mount in sorted(container(ds)["volumeMounts"], key=lambda m: -len(m["mountPath"])):
        inside = mount["mountPath"].rstrip("/")
        if mount["name"] in volumes and (path == inside or path.startswith(inside + "/")):
            return volumes[mount["name"]].rstrip("/") + path.removeprefix(inside)
    return None


def test_with_the_detector_the_plugin_takes_its_verdicts_and_not_the_kernel_log() -> None:
    docs = render(*sets(npd__stateHostPath="/var/lib/npd-state"))
    plugin = daemonset(docs, "device-plugin")
    args = container(plugin)["args"]
    assert "--kmsg-path=none" in args
    assert f"--verdict-dir={VERDICTS}" in args
    assert _host_path_of(plugin, VERDICTS) == "/var/lib/npd-state/verdicts"
    (mount,) = [m for m in container(plugin)["volumeMounts"] if m["mountPath"] == VERDICTS]
    assert mount["readOnly"] is True
    # the detector writes them where the plugin reads them
    assert _host_path_of(daemonset(docs, "problem-detector"), VERDICTS) == "/var/lib/npd-state/verdicts"
    assert f"--verdict-dir={VERDICTS}" in container(daemonset(docs, "problem-detector"))["args"]


@pytest.mark.parametrize("simulation", [False, True])
def test_without_the_detector_the_plugin_reads_the_kernel_log_itself(simulation: bool) -> None:
    root = "/var/lib/neuron-sim/other"
    plugin = daemonset(
        render(*PLUGIN_ONLY, *sets(simulation__enabled=simulation, simulation__hostRoot=root)), "device-plugin"
    )
    c = container(plugin)
    assert not [a for a in c["args"] if a.startswith(("--kmsg-path", "--verdict-dir"))], "the plugin's default log"
    assert not [v for v in plugin["spec"]["template"]["spec"]["volumes"] if "verdicts" in str(v)]
    # the plugin's default, <host-root>/dev/kmsg, is the node's kernel log
    (host_root,) = [a.removeprefix("--host-root=") for a in c["args"] if a.startswith("--host-root=")]
    assert _host_path_of(plugin, f"{host_root}/dev/kmsg") == (f"{root}/dev/kmsg" if simulation else "/dev/kmsg")
    sc = c["securityContext"]
    if simulation:  # a file: no privilege
        assert "privileged" not in sc
        assert "add" not in sc["capabilities"]
    else:
        assert sc["privileged"] is True
        assert sc["capabilities"]["add"] == ["SYSLOG"]


def test_plugin_kmsg_privilege_can_be_turned_off() -> None:
    plugin = daemonset(render(*PLUGIN_ONLY, *sets(devicePlugin__kmsgPrivileged=False)), "device-plugin")
    sc = container(plugin)["securityContext"]
    assert "privileged" not in sc
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}


@pytest.mark.parametrize("args", [[], PLUGIN_ONLY], ids=["with-detector", "plugin-only"])
def test_the_plugin_gets_no_environment_it_does_not_read(args: list[str]) -> None:
    # its node's name only for the UltraServer labels (and the node report, with the scheduler)
    node = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    assert container(daemonset(render(*args), "device-plugin"))["env"] == [node]
    no_labels = sets(ultraServer__nodeLabels=False)
    assert "env" not in container(daemonset(render(*args, *no_labels), "device-plugin"))
    extra = [{"name": "NEURON_DP_LOG_LEVEL", "value": "debug"}]
    with_extra = render(*args, *no_labels, *sets(devicePlugin__extraEnv=extra))
    assert container(daemonset(with_extra, "device-plugin"))["env"] == extra


def test_test_pods_run_unprivileged_as_nobody() -> None:
    for pod in of_kind(render(), "Pod"):
        assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        (c,) = pod["spec"]["containers"]
        assert c["securityContext"] == {
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }


def test_host_paths_are_read_only_except_the_documented_ones() -> None:
    writable = {
        "device-plugin": {"/var/lib/kubelet/device-plugins"},
        "node-metrics": set(),
        "problem-detector": {"/var/lib/neuron-problem-detector"},
    }
    docs = render()
    for component, allowed in writable.items():
        ds = daemonset(docs, component)
        host_volumes = {v["name"] for v in ds["spec"]["template"]["spec"]["volumes"] if "hostPath" in v}
        rw = {
            m["mountPath"] for m in container(ds)["volumeMounts"] if m["name"] in host_volumes and not m.get("readOnly")
        }
        assert rw == allowed, component


# --- RBAC ------------------------------------------------------------------------------------


def _rules(docs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    (role,) = [d for d in of_kind(docs, "ClusterRole") if d["metadata"]["name"] == name]
    return list(role["rules"])


NPD_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
]


@pytest.mark.parametrize(
    ("remediation", "node_verbs"),
    [({}, ["get"]), ({"taint": True}, ["get", "patch"]), ({"cordon": True}, ["get", "patch"])],
)
def test_problem_detector_rbac_is_exactly_as_documented(remediation: dict[str, bool], node_verbs: list[str]) -> None:
    docs = render(*sets(**{f"npd__remediation__{k}": v for k, v in remediation.items()}))
    expected = [dict(NPD_RULES[0], verbs=node_verbs), *NPD_RULES[1:]]
    assert _rules(docs, "neuron-helm-chart-problem-detector") == expected
    args = container(daemonset(docs, "problem-detector"))["args"]
    assert ("--taint" in args) is bool(remediation.get("taint"))
    assert ("--cordon" in args) is bool(remediation.get("cordon"))


def test_only_the_detector_the_label_writer_and_the_tests_are_bound_to_roles() -> None:
    docs = render()
    subjects = {
        s["name"] for b in of_kind(docs, "ClusterRoleBinding") + of_kind(docs, "RoleBinding") for s in b["subjects"]
    }
    plugin = "neuron-helm-chart-device-plugin"
    assert subjects == {"neuron-helm-chart-problem-detector", plugin, "neuron-helm-chart-tests"}
    # the plugin's one grant is a patch of Nodes, for its node's UltraServer labels (the policy holds it there)
    (binding,) = [b for b in of_kind(docs, "ClusterRoleBinding") if plugin in {s["name"] for s in b["subjects"]}]
    assert _rules(docs, binding["roleRef"]["name"]) == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]
    assert _rules(docs, "neuron-helm-chart-tests") == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}
    ]
    (role,) = of_kind(docs, "Role")
    monitors = {
        "apiGroups": ["monitoring.coreos.com"],
        "resources": ["servicemonitors", "podmonitors", "prometheusrules"],
    }
    # the monitoring check reads the release's own monitor and rules; nothing else, and only reads
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        monitors | {"verbs": ["get"]},
    ]
    (role,) = of_kind(render(*sets(nodeMetrics__monitoring__kind="none")), "Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]


def test_an_existing_service_account_can_be_named() -> None:
    docs = render(*sets(devicePlugin__serviceAccount={"create": False, "name": "my-sa", "annotations": {}}))
    assert daemonset(docs, "device-plugin")["spec"]["template"]["spec"]["serviceAccountName"] == "my-sa"
    assert "neuron-helm-chart-device-plugin" not in {d["metadata"]["name"] for d in of_kind(docs, "ServiceAccount")}


# --- the Neuron-aware scheduler: the device plugin's NeuronNode reports ------------------------

SCHEDULER = sets(scheduler__enabled=True)
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
PLUGIN_SA = "neuron-helm-chart-device-plugin"


def _plugin_pod(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    ds = daemonset(docs, "device-plugin")
    return ds["spec"]["template"]["spec"], container(ds)


def test_without_the_scheduler_nothing_of_the_report_is_rendered() -> None:
    assert not [d for d in render() if "neuronnode" in json.dumps(d).lower()]
    # and without the UltraServer labels either, the plugin has no token at all
    docs = render(*sets(ultraServer__nodeLabels=False))
    pod, c = _plugin_pod(docs)
    assert not [a for a in c["args"] if a.startswith("--node-report")]
    assert "env" not in c
    assert pod["automountServiceAccountToken"] is False
    assert not [m for m in c["volumeMounts"] if m["mountPath"] == TOKEN_DIR]


def test_with_the_scheduler_the_plugin_reports_its_node_with_a_token_of_its_own_pod() -> None:
    extra = [{"name": "NEURON_DP_LOG_LEVEL", "value": "debug"}]
    docs = render(*SCHEDULER, *sets(scheduler__nodeReportInterval=45, devicePlugin__extraEnv=extra))
    pod, c = _plugin_pod(docs)
    assert c["args"][-3:] == ["--node-report", "--node-report-interval=45", "--ultraserver-labels"]
    assert c["env"] == [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}, *extra]
    # this container alone gets a token, bound to its pod (so it names the node)
    assert pod["automountServiceAccountToken"] is False
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == TOKEN_DIR]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    # what the kubernetes client's in-cluster configuration reads: token, ca.crt, namespace
    sources = volume["projected"]["sources"]
    assert sources[0] == {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}
    assert sources[1]["configMap"] == {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert sources[2]["downwardAPI"]["items"] == [
        {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
    ]
    (sa,) = [d for d in of_kind(docs, "ServiceAccount") if d["metadata"]["name"] == PLUGIN_SA]
    assert sa["automountServiceAccountToken"] is False
    assert not [a for a in container(daemonset(docs, "node-metrics"))["args"] if "node-report" in a]


def test_the_plugin_may_create_and_patch_neuronnodes_and_nothing_else() -> None:
    docs = render(*SCHEDULER)
    assert _rules(docs, PLUGIN_SA) == [
        {"apiGroups": ["neuron.aws.com"], "resources": ["neuronnodes"], "verbs": ["create", "patch"]}
    ]
    (binding,) = [b for b in of_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"] == PLUGIN_SA]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": PLUGIN_SA, "namespace": "kube-system"}]


def _policy(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The device plugin's policy (the detector has one of its own)."""
    (policy,) = [p for p in of_kind(docs, "ValidatingAdmissionPolicy") if p["metadata"]["name"].startswith(PLUGIN_SA)]
    (binding,) = [
        b for b in of_kind(docs, "ValidatingAdmissionPolicyBinding") if b["metadata"]["name"].startswith(PLUGIN_SA)
    ]
    return policy, binding


@pytest.mark.parametrize(
    ("args", "user"),
    [
        ([], f"system:serviceaccount:kube-system:{PLUGIN_SA}"),
        (sets(devicePlugin__serviceAccount={"create": False, "name": "my-sa", "annotations": {}}),
         "system:serviceaccount:kube-system:my-sa"),
    ],
    ids=["created", "existing"],
)  # fmt: skip
def test_an_admission_policy_lets_the_plugin_write_only_its_own_nodes_report(args: list[str], user: str) -> None:
    docs = render(*SCHEDULER, *args)
    policy, binding = _policy(docs)
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == (["neuron.aws.com"], ["neuronnodes"])
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    # it applies to the plugin's service account alone (the one its ClusterRoleBinding names)
    (condition,) = spec["matchConditions"]
    assert condition["expression"] == f'request.userInfo.username == "{user}"'
    (crb,) = [b for b in of_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"] == PLUGIN_SA]
    assert user == "system:serviceaccount:{namespace}:{name}".format(**crb["subjects"][0])
    # keyed on the node claim of a pod-bound token, against the object's name
    variables = {v["name"]: " ".join(v["expression"].split()) for v in spec["variables"]}
    assert "request.userInfo.extra['authentication.kubernetes.io/node-name'][0]" in variables["node"]
    assert "has(request.userInfo.extra)" in variables["node"], "a token without extra info must not be an error"
    assert variables["target"] == "object != null ? object.metadata.name : oldObject.metadata.name"
    assert [v["expression"] for v in spec["validations"]] == [
        "variables.node != ''",
        "variables.node == '' || variables.node == variables.target",
    ]
    assert {v["reason"] for v in spec["validations"]} == {"Forbidden"}
    assert "may write only NeuronNode" in spec["validations"][1]["messageExpression"]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


def _crd(docs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    (crd,) = of_kind(docs if docs is not None else render(*SCHEDULER), "CustomResourceDefinition")
    return crd


def _reports() -> list[dict[str, Any]]:
    """A NeuronNode of every instance type, idle and busy (holdings, unhealthy devices, pods, pending cores)."""
    import datetime as dt

    from neuron_model.instance_types import INSTANCE_TYPES
    from neuron_model.report import NodeReport
    from neuron_model.ultraserver import Mode, State, UltraServerIdentity, UltraServerReading

    now = dt.datetime(2026, 11, 24, 8, 0, tzinfo=dt.UTC)
    objects = []
    for it in INSTANCE_TYPES.values():
        for cores_per_device in (2, 8):  # (trn2 at logical-core settings 2 and 1)
            name = it.name.replace(".", "-") + f"-{cores_per_device}"
            total = it.devices * cores_per_device
            idle = NodeReport(name, it.name, it.topology, it.devices, it.torus_shape, it.adjacency(), cores_per_device,
                              1, frozenset(range(total)), frozenset(), frozenset(), now)  # fmt: skip
            ultraserver = None
            if it.ultraserver:  # a node of a 4-node UltraServer, every optional field of the report present
                identity = UltraServerIdentity((Mode.X4, Mode.X2H, Mode.X2V, Mode.X1),
                                               {4: "00c0ffee12345678", 2: "0123456789abcdef"}, {4: 3, 2: 1})  # fmt: skip
                ultraserver = UltraServerReading(State.IDENTIFIED, identity, "")
            busy = NodeReport(f"{name}-busy", None, it.topology, it.devices, it.torus_shape, it.adjacency(),
                              cores_per_device, 2, frozenset(range(1, total, 3)), frozenset({it.devices - 1}),
                              frozenset({"ml/train-0", "default/infer"}), now, ultraserver,
                              pending_cores=frozenset({0}), multi_node_unfit=frozenset({0}),
                              pod_cores={"ml/train-0": frozenset({0, 2})})  # fmt: skip
            objects += [idle.to_object(), busy.to_object()]
    return objects


def _validate_reports(tmp_path: Path, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """kubectl-validate's verdict on each object, against the chart's CRD alone (the API server's own
    structural-schema validation, offline)."""
    crds = tmp_path / "crds"
    crds.mkdir(exist_ok=True)
    (crds / "neuronnode.yaml").write_text(yaml.safe_dump(_crd()))
    manifests = tmp_path / "neuronnodes.yaml"
    manifests.write_text(yaml_streams.dump_all(objects))
    tools = chart_tools()
    result = subprocess.run(
        [tools["KUBECTL_VALIDATE"], str(manifests), "--version", "1.30", "--local-crds", str(crds), "-o", "json"],
        capture_output=True, text=True, check=False, env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")},
    )  # fmt: skip
    verdicts: list[dict[str, Any]] = json.loads(result.stdout)[str(manifests)]
    assert len(verdicts) == len(objects), result.stdout + result.stderr
    return verdicts


def test_the_crd_accepts_the_report_of_every_instance_type(tmp_path: Path) -> None:
    objects = _reports()
    for obj, verdict in zip(objects, _validate_reports(tmp_path, objects), strict=True):
        assert verdict["status"] == "Success", (obj["metadata"]["name"], verdict)


@pytest.mark.parametrize(
    ("path", "value", "complaint"),
    [
        (["freeCores"], ["0"], "status.freeCores[0] in body must be of type integer"),
        (["topology", "kind"], "mesh", "status.topology.kind: Unsupported value"),
        (["heartbeatTime"], "yesterday", "status.heartbeatTime"),
        (["pods"], ["no-namespace"], "status.pods[0] in body should match"),
        (["devices"], None, "status.devices: Required value"),
    ],
    ids=["core-as-string", "unknown-topology", "not-a-time", "pod-without-namespace", "missing-column-field"],
)
def test_the_crd_refuses_a_malformed_report(tmp_path: Path, path: list[str], value: Any, complaint: str) -> None:
    """The check above can fail: the API server would refuse these."""
    good, obj = _reports()[:2]
    target = obj["status"]
    for key in path[:-1]:
        target = target[key]
    if value is None:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    accepted, refused = _validate_reports(tmp_path, [good, obj])
    assert accepted["status"] == "Success", accepted
    assert refused["status"] == "Failure", f"accepted {path}={value!r}"
    assert complaint in refused["message"], refused["message"]


def test_the_crd_types_every_field_of_the_report_and_its_columns_read_it() -> None:
    from neuron_model.instance_types import TopologyKind
    from neuron_model.report import GROUP, KIND, PLURAL, VERSION

    crd = _crd()
    assert crd["metadata"]["name"] == f"{PLURAL}.{GROUP}"
    assert (crd["spec"]["group"], crd["spec"]["scope"], crd["spec"]["names"]["kind"]) == (GROUP, "Cluster", KIND)
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == (VERSION, True, True)
    assert "subresources" not in version, "the plugin applies the whole object"
    status_schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    (busy,) = [r for r in _reports() if r["metadata"]["name"] == "trn2u-48xlarge-2-busy"]
    status = busy["status"]  # every optional field present
    assert (
        set(status_schema["properties"])
        == set(status)
        == {*status_schema["required"], "ultraServer", "pendingCores", "multiNodeUnfitDevices", "podCores"}
    )
    ultra = status_schema["properties"]["ultraServer"]
    assert set(ultra["properties"]) == {*status["ultraServer"], "reason"}  # reason: pending and invalid only
    assert set(ultra["properties"]["groups"]["items"]["properties"]) == set(status["ultraServer"]["groups"][0])
    assert set(status_schema["properties"]["topology"]["properties"]) == set(status["topology"])
    assert set(status_schema["properties"]["topology"]["properties"]["kind"]["enum"]) == {str(k) for k in TopologyKind}
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert list(columns) == ["Instance", "Devices", "Cores", "Health", "UltraServer", "Heartbeat"]
    assert columns["Heartbeat"]["type"] == "date"
    for column in columns.values():
        path = column["jsonPath"].removeprefix(".status.").split(".")
        value, schema = status, status_schema
        for key in path:
            value, schema = value[key], schema["properties"][key]
        assert isinstance(value, str), column  # present in the report, and a string as the schema says
        assert schema["type"] == "string"
    assert status["ultraServer"]["summary"] == "00c0ffee12345678/3 of 4"
    assert (status["devices"], status["health"]) == (f"{len(status['freeDevices'])}/16", "15/16 healthy")


def test_the_scheduler_objects_validate_against_kubernetes_1_30_and_the_newest(tmp_path: Path) -> None:
    docs = render(*SCHEDULER)
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert {k: labels.get(k) for k in STANDARD_LABELS} == STANDARD_LABELS, doc["metadata"]["name"]
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds
    manifests = tmp_path / "manifests.yaml"
    manifests.write_text(yaml_streams.dump_all(docs))
    for version, args in _kube_versions():
        result = _validate(manifests, *args)
        assert result.returncode == 0, f"Kubernetes {version}:\n{result.stdout}{result.stderr}"


# --- images ----------------------------------------------------------------------------------


def _images(docs: list[dict[str, Any]]) -> list[str]:
    workloads = of_kind(docs, "DaemonSet")
    images = [container(d)["image"] for d in workloads]
    return images + [c["image"] for p in of_kind(docs, "Pod") for c in p["spec"]["containers"]]


def test_images_default_to_the_app_version() -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    for image in _images(render()):
        assert re.fullmatch(rf"localhost/neuron-helm-chart/[a-z-]+:{re.escape(app_version)}", image), image


def test_global_image_registry_wins_over_every_component_registry() -> None:
    images = _images(render(*sets(global__imageRegistry="registry.example.internal:5000")))
    assert images
    assert all(i.startswith("registry.example.internal:5000/neuron-helm-chart/") for i in images)


def test_a_digest_pins_the_tagged_image() -> None:
    digest = "sha256:" + "ab" * 32
    docs = render(*sets(devicePlugin__image__digest=digest, devicePlugin__image__tag="9.9.9"))
    image = container(daemonset(docs, "device-plugin"))["image"]
    assert image == f"localhost/neuron-helm-chart/device-plugin:9.9.9@{digest}"
    docs = render(*sets(devicePlugin__image__digest=digest))  # the tag defaults to appVersion, digest or not
    assert container(daemonset(docs, "device-plugin"))["image"].endswith(f"/device-plugin:0.1.0@{digest}")
    assert container(daemonset(docs, "node-metrics"))["image"].endswith(":0.1.0")


def test_pull_secrets_merge_global_and_component() -> None:
    docs = render(*sets(global__imagePullSecrets=["g"], nodeMetrics__imagePullSecrets=["m", "g"]))
    spec = daemonset(docs, "node-metrics")["spec"]["template"]["spec"]
    assert spec["imagePullSecrets"] == [{"name": "g"}, {"name": "m"}]
    assert daemonset(docs, "device-plugin")["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "g"}]


# --- placement -------------------------------------------------------------------------------


def _match_expressions(ds: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = ds["spec"]["template"]["spec"]["affinity"]
    (term,) = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return list(term["matchExpressions"])


def test_default_placement_lists_every_instance_type_the_services_know() -> None:
    from neuron_model.instance_types import ALL_NAMES

    for ds in of_kind(render(), "DaemonSet"):
        by_key = {e["key"]: e for e in _match_expressions(ds)}
        listed = set(by_key["node.kubernetes.io/instance-type"]["values"])
        # every table entry, and every other name of its hardware: the Trainium3 driver's names and
        # AWS's chart names (instance_types.ALIASES), so a node labelled with one gets the agents
        assert set(ALL_NAMES) <= listed
        assert by_key["eks.amazonaws.com/compute-type"] == {
            "key": "eks.amazonaws.com/compute-type",
            "operator": "NotIn",
            "values": ["fargate", "hybrid", "auto"],
        }
        tolerations = ds["spec"]["template"]["spec"]["tolerations"]
        assert any(t.get("key") == "aws.amazon.com/neuron" or t.get("key") is None for t in tolerations)


def test_nfd_placement_and_its_rule() -> None:
    docs = render("-f", str(CHART / "ci" / "nfd-values.yaml"))
    for ds in of_kind(docs, "DaemonSet"):
        assert _match_expressions(ds)[0] == {
            "key": "feature.node.kubernetes.io/aws-neuron",
            "operator": "In",
            "values": ["true"],
        }
    (rule,) = of_kind(docs, "NodeFeatureRule")
    expressions = rule["spec"]["rules"][0]["matchFeatures"][0]["matchExpressions"]
    assert expressions["vendor"] == {"op": "In", "value": ["1d0f"]}
    assert set(expressions["device"]["value"]) == {
        "7064",
        "7065",
        "7066",
        "7067",
        "7164",
        "7264",
        "7364",
        "7564",
        "7565",
    }
    from neuron_model.pci import neuron_device_ids

    # every id of the node model, and nothing else
    assert set(expressions["device"]["value"]) == {f"{i:04x}" for i in neuron_device_ids()}


def test_node_feature_rule_needs_its_api_or_force() -> None:
    values = sets(placement__mode="nfd", placement__nodeFeatureRule__enabled=True)
    assert of_kind(render(*values), "NodeFeatureRule") == []
    assert len(of_kind(render(*values, *NFD_API), "NodeFeatureRule")) == 1


def test_a_component_affinity_merges_with_placement() -> None:
    default = _match_expressions(daemonset(render(), "problem-detector"))
    preferred = [{"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}}]
    anti = {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname"}]}
    fields = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
    custom = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, fields]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": preferred,
        },
        "podAntiAffinity": anti,
    }
    docs = render(*sets(npd__affinity=custom))
    affinity = daemonset(docs, "problem-detector")["spec"]["template"]["spec"]["affinity"]
    # Kubernetes ORs the terms: placement must be in every one of them
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [*default, {"key": "gpu", "operator": "DoesNotExist"}]},
        {"matchExpressions": default, **fields},
    ]
    assert affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert affinity["podAntiAffinity"] == anti
    assert _match_expressions(daemonset(docs, "device-plugin"))[0]["key"] == "node.kubernetes.io/instance-type"
    assert _match_expressions(daemonset(docs, "device-plugin")) == default


def test_an_affinity_without_required_terms_still_gets_placement() -> None:
    term = {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
    preferred = [{"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}}]
    for args in ([], sets(placement__mode="nfd")):
        default = daemonset(render(*args), "node-metrics")["spec"]["template"]["spec"]["affinity"]
        required = default["nodeAffinity"]
        for custom, expected in (
            ({"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}},
             {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}, "nodeAffinity": required}),
            ({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}},
             {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred, **required}}),
        ):  # fmt: skip
            ds = daemonset(render(*args, *sets(nodeMetrics__affinity=custom)), "node-metrics")
            assert ds["spec"]["template"]["spec"]["affinity"] == expected


def test_with_placement_none_a_component_affinity_is_used_as_given() -> None:
    custom = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}]
            }
        }
    }
    docs = render(*sets(placement__mode="none", placement__excludeComputeTypes=[], devicePlugin__affinity=custom))
    assert daemonset(docs, "device-plugin")["spec"]["template"]["spec"]["affinity"] == custom


def test_placement_none_renders_no_affinity() -> None:
    docs = render(*sets(placement__mode="none", placement__excludeComputeTypes=[]))
    for ds in of_kind(docs, "DaemonSet"):
        assert "affinity" not in ds["spec"]["template"]["spec"]


def test_the_rules_device_ids_are_the_librarys_neuron_ids() -> None:
    """The rule's PCI ids and the simulator's come from one table (neuron_model.pci)."""
    from neuron_model import pci

    (rule,) = of_kind(render("-f", str(CHART / "ci" / "nfd-values.yaml")), "NodeFeatureRule")
    (term,) = rule["spec"]["rules"][0]["matchFeatures"]
    assert term["matchExpressions"]["vendor"]["value"] == ["1d0f"]
    assert sorted(term["matchExpressions"]["device"]["value"]) == [f"{i:04x}" for i in pci.neuron_device_ids()]


# --- the driver, through KMM -----------------------------------------------------------------


def module(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (m,) = of_kind(docs, "Module")
    return m


def test_the_driver_is_off_by_default_and_needs_its_api_or_force() -> None:
    assert of_kind(render(*KMM_API), "Module") == []
    assert of_kind(render(*DRIVER), "Module") == []
    assert len(of_kind(render(*DRIVER, *KMM_API), "Module")) == 1
    assert len(of_kind(render(*DRIVER, *sets(driver__force=True)), "Module")) == 1


def test_the_module_loads_neuron_from_the_image_of_each_kernel() -> None:
    m = module(render(*DRIVER, *KMM_API, *sets(driver__image__registry="registry.example.internal")))
    assert m["apiVersion"] == "kmm.sigs.x-k8s.io/v1beta1"
    assert m["metadata"]["namespace"] == "kube-system"
    assert m["metadata"]["labels"]["app.kubernetes.io/component"] == "driver"
    container = m["spec"]["moduleLoader"]["container"]
    assert container["modprobe"] == {"moduleName": "neuron"}
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["kernelMappings"] == [
        {
            "regexp": "^.+$",
            "containerImage": "registry.example.internal/neuron/neuron-driver:2.22.2.0-${KERNEL_FULL_VERSION}",
        }
    ]
    assert m["spec"]["selector"] == {"feature.node.kubernetes.io/aws-neuron": "true"}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert m["spec"]["tolerations"] == values["driver"]["tolerations"]
    assert "imageRepoSecret" not in m["spec"]


def test_the_module_takes_the_global_registry_kernel_regexp_and_pull_policy() -> None:
    m = module(render(*DRIVER, *KMM_API, *sets(
        global__imageRegistry="mirror.example.internal:5000", driver__image__registry="ignored.example.internal",
        driver__kernelVersionRegexp="^6\\.1\\..*$", driver__image__pullPolicy="Always",
    )))  # fmt: skip
    (mapping,) = m["spec"]["moduleLoader"]["container"]["kernelMappings"]
    assert mapping == {
        "regexp": "^6\\.1\\..*$",
        "containerImage": "mirror.example.internal:5000/neuron/neuron-driver:2.22.2.0-${KERNEL_FULL_VERSION}",
    }
    assert m["spec"]["moduleLoader"]["container"]["imagePullPolicy"] == "Always"


def test_the_module_pull_secret_defaults_to_the_first_global_one() -> None:
    docs = render(*DRIVER, *KMM_API, *sets(global__imagePullSecrets=["first", "second"]))
    assert module(docs)["spec"]["imageRepoSecret"] == {"name": "first"}
    named = render(*DRIVER, *KMM_API, *sets(global__imagePullSecrets=["first"], driver__imageRepoSecret="kmm-pull"))
    assert module(named)["spec"]["imageRepoSecret"] == {"name": "kmm-pull"}


def test_the_module_selector_is_the_nfd_label_or_the_drivers_own() -> None:
    custom = render(*DRIVER, *KMM_API, *sets(placement__nfdLabel="example.com/neuron"))
    assert module(custom)["spec"]["selector"] == {"example.com/neuron": "true"}
    selector = {"node.kubernetes.io/instance-type": "trn1.32xlarge", "neuron": "yes"}
    own = render(*DRIVER, *KMM_API, *sets(placement__mode="instanceType", driver__nodeSelector=selector))
    assert module(own)["spec"]["selector"] == selector


KMM_READY = "kmm.node.kubernetes.io/kube-system.neuron.ready"


def test_the_device_plugin_can_wait_for_kmms_ready_label() -> None:
    default = _match_expressions(daemonset(render(*DRIVER), "device-plugin"))
    assert KMM_READY not in {e["key"] for e in default}, "opt-in"
    docs = render(*DRIVER, *KMM_API, *sets(driver__devicePluginWaitsForModule=True))
    assert _match_expressions(daemonset(docs, "device-plugin")) == [*default, {"key": KMM_READY, "operator": "Exists"}]
    assert module(docs)["metadata"]["name"] == "neuron", "the label names the Module"
    for other in ("node-metrics", "problem-detector"):
        assert KMM_READY not in {e["key"] for e in _match_expressions(daemonset(docs, other))}


# How KMM names the label (the pinned release's internal/utils/kmmlabels.go: GetKernelModuleReadyNodeLabel formats
# "kmm.node.kubernetes.io/%s.%s.ready" from the Module's namespace and name; its node labeller only keeps and
# removes labels this expression parses, and sets them with an empty value, hence Exists).
KMM_READY_LABEL = re.compile(r"^kmm\.node\.kubernetes\.io/([a-zA-Z0-9-]+)\.([a-zA-Z0-9-\.]+)\.ready$")


@pytest.mark.parametrize(("release", "namespace"), [("neuron-helm-chart", "kube-system"), ("n", "neuron-system")])
def test_the_plugin_waits_for_the_label_kmm_sets_for_this_module(release: str, namespace: str) -> None:
    out = helm("template", release, str(CHART), "--namespace", namespace, *DRIVER, *KMM_API,
               *sets(driver__devicePluginWaitsForModule=True)).stdout  # fmt: skip
    docs = [d for d in yaml_streams.load_all(out) if d]
    m = module(docs)
    (waited,) = [e for e in _match_expressions(daemonset(docs, "device-plugin")) if e["key"].startswith("kmm.")]
    parsed = KMM_READY_LABEL.match(waited["key"])
    assert parsed, waited["key"]
    assert parsed.groups() == (m["metadata"]["namespace"], m["metadata"]["name"]) == (namespace, m["metadata"]["name"])
    assert waited["operator"] == "Exists"


def test_kmms_limit_on_the_modules_name_and_namespace_is_reached_not_passed() -> None:
    """KMM's admission webhook (the pinned release's internal/webhook/module.go, maxCombinedLength) refuses a
    Module whose name and namespace together are longer than 40 characters: 40 renders, 41 is refused before
    KMM sees it."""
    out = helm("template", "x", str(CHART), "--namespace", "default", *DRIVER, *KMM_API,
               *sets(driver__moduleName="n" * 33)).stdout  # fmt: skip
    m = module([d for d in yaml_streams.load_all(out) if d])
    assert len(m["metadata"]["name"] + m["metadata"]["namespace"]) == 40
    unserved = helm("template", "x", str(CHART), *DRIVER, *sets(driver__moduleName="n" * 34)).stdout
    assert "kind: Module" not in unserved, "no Module, no limit"


def test_the_ready_label_joins_every_term_of_the_plugins_own_affinity() -> None:
    terms = [{"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {"matchExpressions": []}]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    docs = render(*DRIVER, *sets(driver__devicePluginWaitsForModule=True, devicePlugin__affinity=affinity))
    spec = daemonset(docs, "device-plugin")["spec"]["template"]["spec"]
    got = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(got) == 2
    for term in got:
        keys = [e["key"] for e in term["matchExpressions"]]
        assert keys[0] == "feature.node.kubernetes.io/aws-neuron"
        assert KMM_READY in keys
    assert {"key": "gpu", "operator": "DoesNotExist"} in got[0]["matchExpressions"]


# --- OpenShift -------------------------------------------------------------------------------

OPENSHIFT_VALUES = ["-f", str(CHART / "ci" / "openshift-values.yaml")]


@pytest.mark.parametrize(
    ("args", "openshift"),
    [([], False), (OPENSHIFT_API, True), (sets(openshift__force=True), True)],
    ids=["kubernetes", "openshift-api", "forced"],
)
def test_helm_test_pods_fit_restricted_v2_on_openshift(args: list[str], openshift: bool) -> None:
    pods = of_kind(render(*OPENSHIFT_VALUES, *args), "Pod")
    assert pods
    for pod in pods:
        security = pod["spec"]["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
        # restricted-v2 assigns the UID from the namespace's range and refuses a fixed one
        assert ("runAsUser" in security) is (not openshift)
        assert ("runAsGroup" in security) is (not openshift)
        for c in pod["spec"]["containers"]:
            assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert not [v for v in pod["spec"].get("volumes", []) if "hostPath" in v]


def test_openshift_values_grant_the_agents_the_privileged_scc() -> None:
    docs = render(*OPENSHIFT_VALUES, *OPENSHIFT_API)
    (role,) = [r for r in of_kind(docs, "Role") if r["metadata"]["name"].endswith("-privileged-scc")]
    assert role["rules"] == [{
        "apiGroups": ["security.openshift.io"], "resources": ["securitycontextconstraints"],
        "resourceNames": ["privileged"], "verbs": ["use"],
    }]  # fmt: skip
    (binding,) = [b for b in of_kind(docs, "RoleBinding") if b["metadata"]["name"] == role["metadata"]["name"]]
    agents = {ds["spec"]["template"]["spec"]["serviceAccountName"] for ds in of_kind(docs, "DaemonSet")}
    assert {s["name"] for s in binding["subjects"]} == agents
    assert len(agents) == 3
    # a disabled agent is not bound; without the value nothing is granted
    fewer = render(*OPENSHIFT_VALUES, *sets(npd__enabled=False))
    (binding,) = [b for b in of_kind(fewer, "RoleBinding") if b["metadata"]["name"].endswith("-privileged-scc")]
    assert {s["name"] for s in binding["subjects"]} == {
        "neuron-helm-chart-device-plugin",
        "neuron-helm-chart-node-metrics",
    }
    assert not [r for r in of_kind(render(), "Role") if "scc" in r["metadata"]["name"]]


@pytest.mark.parametrize(
    "component_values",
    [[], sets(devicePlugin__enabled=False, draDriver__enabled=True)],
    ids=["device-plugin", "dra-driver"],
)
def test_every_node_agent_with_host_paths_is_bound_to_the_privileged_scc(component_values: list[str]) -> None:
    """Every DaemonSet of the release with a hostPath volume or UID 0 (what restricted-v2 refuses) is
    admitted on OpenShift: its ServiceAccount is in the SCC binding (the DRA driver's was not)."""
    docs = render(*OPENSHIFT_VALUES, *OPENSHIFT_API, *component_values)
    (binding,) = [b for b in of_kind(docs, "RoleBinding") if b["metadata"]["name"].endswith("-privileged-scc")]
    bound = {s["name"] for s in binding["subjects"]}
    for ds in of_kind(docs, "DaemonSet"):
        pod = ds["spec"]["template"]["spec"]
        host_paths = [v for v in pod.get("volumes", []) if "hostPath" in v]
        root = any((c.get("securityContext") or {}).get("runAsUser") == 0 for c in pod["containers"])
        if host_paths or root:
            assert pod["serviceAccountName"] in bound, ds["metadata"]["name"]


def test_the_agents_need_the_privileged_scc_as_the_readme_says() -> None:
    """What rules out restricted-v2 for every agent: a hostPath volume and UID 0."""
    for ds in of_kind(render(*OPENSHIFT_VALUES, *OPENSHIFT_API), "DaemonSet"):
        pod = ds["spec"]["template"]["spec"]
        assert [v for v in pod["volumes"] if "hostPath" in v], ds["metadata"]["name"]
        assert container(ds)["securityContext"]["runAsUser"] == 0
        assert container(ds)["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    readme = (REPO / "docs" / "openshift.md").read_text()
    for component in ("device plugin", "node metrics", "problem detector"):
        assert f"| {component} | `privileged` |" in readme
    assert "| helm test pods | `restricted-v2` |" in readme


# --- the AWS Neuron operator's DeviceConfig, field by field ----------------------------------


def test_device_config_drivers_image() -> None:
    m = module(render(*DRIVER, *KMM_API, *sets(driver__image__registry="ghcr.io")))
    (mapping,) = m["spec"]["moduleLoader"]["container"]["kernelMappings"]
    assert mapping["containerImage"] == "ghcr.io/neuron/neuron-driver:2.22.2.0-${KERNEL_FULL_VERSION}"


def test_device_config_device_plugin_image() -> None:
    image = {"registry": "public.example.internal", "repository": "neuron/neuron-device-plugin", "tag": "2.23.30.0"}
    docs = render(*sets(**{f"devicePlugin__image__{k}": v for k, v in image.items()}))
    assert (
        container(daemonset(docs, "device-plugin"))["image"]
        == "public.example.internal/neuron/neuron-device-plugin:2.23.30.0"
    )


@pytest.mark.parametrize(
    ("key", "name"),
    [("kubeScheduler", "customSchedulerImage"), ("extender", "schedulerExtensionImage")],
)
def test_device_config_scheduler_images(key: str, name: str) -> None:
    image = {"registry": "public.example.internal", "repository": f"neuron/{name.lower()}", "tag": "2.30.0.0"}
    docs = render(*sets(scheduler__enabled=True, **{f"scheduler__{key}__image__{k}": v for k, v in image.items()}))
    images = {c["image"] for d in of_kind(docs, "Deployment") for c in d["spec"]["template"]["spec"]["containers"]}
    assert f"public.example.internal/neuron/{name.lower()}:2.30.0.0" in images


def test_device_config_image_repo_secret() -> None:
    docs = render(*DRIVER, *KMM_API, *sets(global__imagePullSecrets=["image-repo-secret"]))
    assert module(docs)["spec"]["imageRepoSecret"] == {"name": "image-repo-secret"}
    pods = [d["spec"]["template"]["spec"] for d in of_kind(docs, "DaemonSet")] + [
        p["spec"] for p in of_kind(docs, "Pod")
    ]
    assert pods
    assert all(p["imagePullSecrets"] == [{"name": "image-repo-secret"}] for p in pods)


def test_device_config_selector() -> None:
    label = "feature.node.kubernetes.io/aws-neuron"
    docs = render(*DRIVER, *KMM_API, *NFD_API, *sets(placement__nodeFeatureRule__enabled=True))
    assert module(docs)["spec"]["selector"] == {label: "true"}
    for ds in of_kind(docs, "DaemonSet"):
        assert _match_expressions(ds)[0] == {"key": label, "operator": "In", "values": ["true"]}
    (rule,) = of_kind(docs, "NodeFeatureRule")
    assert rule["spec"]["rules"][0]["labels"] == {label: "true"}
    # any equality selector: placement none, the same labels for the driver and every agent
    selector = {"example.com/accelerator": "neuron"}
    per_component = {f"{k}__nodeSelector": selector for k in COMPONENTS}
    docs = render(*DRIVER, *KMM_API, *sets(
        placement__mode="none", placement__excludeComputeTypes=[], driver__nodeSelector=selector, **per_component
    ))  # fmt: skip
    assert module(docs)["spec"]["selector"] == selector
    for ds in of_kind(docs, "DaemonSet"):
        assert ds["spec"]["template"]["spec"]["nodeSelector"] == selector
        assert "affinity" not in ds["spec"]["template"]["spec"]


def test_the_device_config_table_names_only_values_that_exist() -> None:
    """Each row's chart values exist in values.yaml."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (REPO / "docs" / "migrating-from-aws.md").read_text()
    section = readme.split("## Coming from the AWS Neuron operator", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.split("|---|---|", 1)[1].splitlines() if line.startswith("| `")]
    fields = [re.match(r"\| `(\w+)`", row)[1] for row in rows]  # type: ignore[index]
    assert fields == [
        "driversImage", "devicePluginImage", "customSchedulerImage", "schedulerExtensionImage", "imageRepoSecret",
        "selector",
    ]  # fmt: skip
    for row in rows:
        chart_column = row.split(" | ", 1)[1]
        for path in re.findall(r"`([a-zA-Z]+(?:\.[a-zA-Z]+)+)(?:=[^`]*)?`", chart_column):
            node: Any = values
            for key in path.split("."):
                assert isinstance(node, dict), f"{path} goes below a leaf value"
                assert key in node, f"{path} (row {row[:40]}...) is not a value"
                node = node[key]


# --- the DaemonSets' shared head: per-component values --------------------------------------


@pytest.mark.parametrize("key", COMPONENTS)
def test_each_daemonset_takes_its_rollout_and_lifecycle_values(key: str) -> None:
    probe = {"path": "/custom", "periodSeconds": 7, "timeoutSeconds": 4, "failureThreshold": 9}
    values = {
        "revisionHistoryLimit": 3,
        "terminationGracePeriodSeconds": 45,
        "updateStrategy": {"type": "OnDelete"},
        "priorityClassName": "neuron-agents",
        "startupProbe": dict(probe, periodSeconds=1),
        "livenessProbe": probe,
        "readinessProbe": dict(probe, path="/ready"),
    }
    docs = render(*sets(**{f"{key}__{name}": value for name, value in values.items()}))
    ds = daemonset(docs, COMPONENTS[key])
    pod = ds["spec"]["template"]["spec"]
    assert ds["spec"]["revisionHistoryLimit"] == 3
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert pod["terminationGracePeriodSeconds"] == 45
    assert pod["priorityClassName"] == "neuron-agents"
    c = container(ds)
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        expected = dict(values[kind])
        assert c[kind] == {"httpGet": {"path": expected.pop("path"), "port": "http"}, **expected}, kind
    for other in set(COMPONENTS.values()) - {COMPONENTS[key]}:
        untouched = daemonset(docs, other)
        assert untouched["spec"]["revisionHistoryLimit"] == 10
        assert container(untouched)["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_probe_defaults_are_the_services_endpoints() -> None:
    for ds in of_kind(render(), "DaemonSet"):
        c = container(ds)
        assert c["startupProbe"]["httpGet"] == c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


def test_the_daemonsets_share_one_head() -> None:
    """Everything above the containers is the same shape for the three components (one helper renders it)."""
    heads = []
    for ds in of_kind(render(), "DaemonSet"):
        pod = {k: v for k, v in ds["spec"]["template"]["spec"].items() if k not in ("containers", "volumes")}
        heads.append((sorted(ds["spec"]), sorted(pod)))
    detector = daemonset(render(), "problem-detector")["spec"]["template"]["spec"]
    assert "automountServiceAccountToken" not in detector, "the detector calls the API server"
    shapes = {(tuple(spec), tuple(k for k in pod if k != "automountServiceAccountToken")) for spec, pod in heads}
    assert len(shapes) == 1, shapes


# --- simulation ------------------------------------------------------------------------------


def test_simulation_points_every_component_at_the_simulated_root() -> None:
    root = "/var/lib/neuron-sim/other"
    docs = render(*sets(simulation__enabled=True, simulation__hostRoot=root))
    for component in COMPONENTS.values():
        ds = daemonset(docs, component)
        assert f"--host-root={root}" in container(ds)["args"]
        paths = {v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"] if "hostPath" in v}
        assert root in paths
        assert not paths & {"/sys", "/dev", "/opt/aws"}, "a simulated node must not see the host's devices"
    assert f"--host-dev-root={root}" in container(daemonset(docs, "device-plugin"))["args"]


def test_real_mode_reads_the_host_under_slash_host() -> None:
    docs = render()
    for component in COMPONENTS.values():
        ds = daemonset(docs, component)
        assert "--host-root=/host" in container(ds)["args"]
        mounts = {m["mountPath"]: m for m in container(ds)["volumeMounts"]}
        for path in ("/host/sys", "/host/dev", "/host/opt/aws", "/host/proc/sys/kernel/random"):
            assert mounts[path]["readOnly"] is True
    assert "--host-dev-root=/" in container(daemonset(docs, "device-plugin"))["args"]


# --- monitoring ------------------------------------------------------------------------------


def test_monitoring_objects_need_the_api_or_force() -> None:
    assert of_kind(render(), "ServiceMonitor") == of_kind(render(), "PrometheusRule") == []
    for args in (MONITORING_API, sets(nodeMetrics__monitoring__force=True)):
        docs = render(*args)
        assert len(of_kind(docs, "ServiceMonitor")) == len(of_kind(docs, "PrometheusRule")) == 1


def test_service_monitor_keeps_pod_labels_and_adds_node_and_job() -> None:
    docs = render(*MONITORING_API, *sets(nodeMetrics__monitoring__additionalLabels={"release": "kps"}))
    (sm,) = of_kind(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kps"
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    assert endpoint["port"] == "http"
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in endpoint["relabelings"]
    assert {"targetLabel": "job", "replacement": "neuron-node-metrics"} in endpoint["relabelings"]
    assert sm["spec"]["selector"]["matchLabels"] == of_kind(docs, "Service")[0]["spec"]["selector"]
    (rule,) = of_kind(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"


def test_the_exporters_service_takes_container_insights_label() -> None:
    """CloudWatch Container Insights' Neuron receiver finds its target by this Service label."""
    docs = render(*sets(nodeMetrics__service__labels={"k8s-app": "neuron-monitor-service"}))
    (svc,) = of_kind(docs, "Service")
    assert svc["metadata"]["labels"]["k8s-app"] == "neuron-monitor-service"
    assert svc["metadata"]["labels"]["app.kubernetes.io/component"] == "node-metrics"
    # the selector stays the chart's: an extra label on the Service selects no other pod
    assert "k8s-app" not in svc["spec"]["selector"]
    (plain,) = of_kind(render(), "Service")
    assert "k8s-app" not in plain["metadata"]["labels"]


@pytest.mark.parametrize("naming", [n.value for n in Naming])
def test_the_exporters_naming_is_any_of_its_own(naming: str) -> None:
    """The schema's choices are the exporter's --naming choices, and each reaches its flag."""
    from neuron_node_metrics.config import parser

    (flag,) = [a for a in parser()._actions if "--naming" in a.option_strings]
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["nodeMetrics"]["properties"]["naming"]["enum"] == list(flag.choices or ())
    (ds,) = [
        d
        for d in of_kind(render(*sets(nodeMetrics__naming=naming)), "DaemonSet")
        if "node-metrics" in d["metadata"]["name"]
    ]
    assert f"--naming={naming}" in ds["spec"]["template"]["spec"]["containers"][0]["args"]


def test_pod_monitor_variant() -> None:
    docs = render("-f", str(CHART / "ci" / "podmonitor-forced-values.yaml"))
    assert of_kind(docs, "ServiceMonitor") == of_kind(docs, "Service") == []
    (pm,) = of_kind(docs, "PodMonitor")
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is True
    assert endpoint["metricRelabelings"][0]["action"] == "drop"


def test_prometheus_rule_is_the_promtool_tested_rules_file() -> None:
    (rule,) = of_kind(render(*MONITORING_API), "PrometheusRule")
    source = yaml.safe_load((CHART / "rules" / "neuron-node-metrics.rules.yaml").read_text())
    assert rule["spec"] == source
    assert of_kind(render(*MONITORING_API, *sets(nodeMetrics__prometheusRule__enabled=False)), "PrometheusRule") == []


def test_dashboards_are_config_maps_for_the_grafana_sidecar() -> None:
    def shipped(*values: str) -> list[dict[str, Any]]:
        docs = render(*sets(nodeMetrics__dashboards__namespace="monitoring"), *values)
        return [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]

    def names(maps: list[dict[str, Any]]) -> list[str]:
        return sorted(k for m in maps for k in m["data"])

    files = sorted(p.name for p in (CHART / "dashboards").glob("*.json"))
    optional = {"neuron-scheduling.json", "neuron-dra.json"}
    assert optional <= set(files)
    # a board over an optional component (the scheduler extender, the DRA driver) ships with it only
    assert names(shipped()) == sorted(set(files) - optional)
    assert names(shipped(*sets(scheduler__enabled=True))) == sorted(set(files) - {"neuron-dra.json"})
    dra = sets(devicePlugin__enabled=False, draDriver__enabled=True)
    assert names(shipped(*dra)) == sorted(set(files) - {"neuron-scheduling.json"})
    both = sets(
        scheduler__enabled=True,
        draDriver__enabled=True,
        draDriver__nodeSelector={"neuron.aws.com/allocator": "dra"},
        devicePlugin__nodeSelector={"neuron.aws.com/allocator": "device-plugin"},
    )
    maps = shipped(*both)
    assert names(maps) == files
    for m in maps:
        assert m["metadata"]["namespace"] == "monitoring"
        for body in m["data"].values():
            assert json.loads(body)["panels"]
    assert not [
        d
        for d in of_kind(render(*sets(nodeMetrics__dashboards__enabled=False)), "ConfigMap")
        if "grafana_dashboard" in d["metadata"]["labels"]
    ]


# --- the detector's rules --------------------------------------------------------------------


def test_chart_rules_are_the_detectors_default_rules() -> None:
    from neuron_problem_detector.rules import default_text

    assert (CHART / "files" / "npd-rules.yaml").read_text() == default_text(), (
        "files/npd-rules.yaml is stale: run `make npd-rules` (the rules are made from the fault table)"
    )


def test_custom_rules_replace_the_shipped_ones_and_roll_the_pods() -> None:
    custom = "source: custom\nconditions: []\nrules: []\n"
    default_docs, custom_docs = render(), render(*sets(npd__rules=custom))

    def rules_map(docs: list[dict[str, Any]]) -> dict[str, Any]:
        (cm,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-rules")]
        return cm

    assert rules_map(custom_docs)["data"]["rules.yaml"] == custom.rstrip("\n")
    checksum = [
        daemonset(d, "problem-detector")["spec"]["template"]["metadata"]["annotations"]["checksum/rules"]
        for d in (default_docs, custom_docs)
    ]
    assert checksum[0] != checksum[1]


# --- values schema: one test per class of mistake ---------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (sets(devicePlugin__enabeld=True), "additional properties 'enabeld' not allowed"),
        (sets(unknownTopLevel=1), "additional properties 'unknownTopLevel' not allowed"),
        (sets(devicePlugin__enabled="yes"), "/devicePlugin/enabled"),
        (sets(npd__logLevel="verbose"), "value must be one of 'debug', 'info', 'warning', 'error'"),
        (sets(nodeMetrics__port=70000), "/nodeMetrics/port"),
        (sets(nodeMetrics__neuronMonitorCommand=["neuron-monitor"]), "/nodeMetrics/neuronMonitorCommand"),
        (sets(devicePlugin__image__digest="sha256:short"), "/devicePlugin/image/digest"),
        (sets(simulation__hostRoot="relative/path"), "/simulation/hostRoot"),
        (sets(placement__mode="everywhere"), "/placement/mode"),
        (sets(nodeMetrics__monitoring__kind="Probe"), "/nodeMetrics/monitoring/kind"),
        (sets(nodeMetrics__monitoring__interval="thirty"), "/nodeMetrics/monitoring/interval"),
        (sets(devicePlugin__extraArgs=["verbose"]), "/devicePlugin/extraArgs/0"),
        (sets(devicePlugin__image__repository=None), "missing property 'repository'"),
        (sets(tests__logicalNcConfig=4), "/tests/logicalNcConfig"),
        (sets(npd__tolerations=[{"operator": "Sometimes"}]), "/npd/tolerations/0/operator"),
        (sets(devicePlugin__livenessProbe__path="healthz"), "/devicePlugin/livenessProbe/path"),
        (sets(npd__readinessProbe__initialDelay=5), "additional properties 'initialDelay' not allowed"),
        (sets(nodeMetrics__revisionHistoryLimit=-1), "/nodeMetrics/revisionHistoryLimit"),
        (sets(npd__terminationGracePeriodSeconds="30s"), "/npd/terminationGracePeriodSeconds"),
        (sets(scheduler__nodeReportInterval=0), "/scheduler/nodeReportInterval"),
        (sets(driver__image__digest="sha256:" + "ab" * 32), "additional properties 'digest' not allowed"),
        (sets(driver__image__tag="2.22:latest"), "/driver/image/tag"),
        (sets(openshift__grantPrivilegedScc="yes"), "/openshift/grantPrivilegedScc"),
    ],
    ids=[
        "misspelt-key",
        "unknown-top-level",
        "wrong-type",
        "enum",
        "out-of-range",
        "monitor-command-not-a-string",
        "bad-digest",
        "relative-path",
        "placement-mode",
        "monitor-kind",
        "duration",
        "flag-without-dashes",
        "missing-required",
        "lnc",
        "toleration",
        "probe-path",
        "probe-unknown-key",
        "revision-history",
        "grace-period",
        "report-interval",
        "driver-digest",
        "driver-tag",
        "openshift-flag",
    ],
)
def test_the_schema_rejects_mistakes_with_a_clear_message(args: list[str], message: str) -> None:
    stderr = refusal(*args)
    assert "values don't meet the specifications of the schema" in stderr
    assert message in stderr, stderr


# --- contradictions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            sets(devicePlugin__enabled=False, nodeMetrics__enabled=False, npd__enabled=False),
            "the release would install nothing",
        ),
        (sets(placement__instanceTypes=[]), "placement.mode=instanceType needs at least one entry"),
        (sets(placement__nodeFeatureRule__enabled=True), "set placement.mode=nfd or disable the rule"),
        (sets(nodeMetrics__service__enabled=False), "enable the Service or use kind PodMonitor"),
        (
            sets(npd__remediation__taint=True, npd__serviceAccount={"create": False, "name": "", "annotations": {}}),
            "npd.remediation needs",
        ),
        (
            sets(scheduler__enabled=True, devicePlugin__enabled=False),
            "scheduler.enabled needs devicePlugin.enabled: the Neuron-aware scheduler places pods from the NeuronNode",
        ),
        (sets(driver__enabled=True, placement__mode="nfd"), "driver.enabled needs driver.image.repository and"),
        ([*DRIVER, *sets(driver__image__tag="")], "driver.enabled needs driver.image.repository and"),
        ([*DRIVER, *sets(placement__mode="instanceType")], "set placement.mode=nfd, or driver.nodeSelector"),
        (sets(driver__devicePluginWaitsForModule=True), "waits for a kernel module the chart does not load"),
        (
            [
                "--namespace",
                "n" * 30,
                *DRIVER,
                *sets(driver__devicePluginWaitsForModule=True, driver__moduleName="n" * 30),
            ],
            "is longer than 63 characters",
        ),
        (
            [*DRIVER, *sets(driver__force=True, driver__moduleName="n" * 34)],
            f'the Module "{"n" * 34}" in namespace "default" has 41',
        ),
    ],
    ids=[
        "nothing-enabled",
        "no-instance-types",
        "nfd-rule-unused",
        "monitor-without-service",
        "remediation-without-sa",
        "scheduler-without-plugin",
        "driver-without-image",
        "driver-without-tag",
        "driver-without-selector",
        "wait-without-driver",
        "ready-label-too-long",
        "module-name-too-long-for-kmm",
    ],
)
def test_contradictions_fail_with_what_to_change(args: list[str], message: str) -> None:
    stderr = refusal(*args)
    assert message in stderr, stderr


# --- the real linters and validators ---------------------------------------------------------


def test_ct_lint_passes_on_every_ci_values_file() -> None:
    tools = chart_tools()
    env = dict(os.environ, PATH=f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}")
    result = subprocess.run(
        [tools["CT"], "lint", "--config", "ct.yaml", "--all", "--lint-conf", f"{tools['CT_ETC']}/lintconf.yaml",
         "--chart-yaml-schema", f"{tools['CT_ETC']}/chart_schema.yaml"],
        cwd=REPO, capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    for values in CI_VALUES:
        assert f'Linting chart with values file "charts/neuron-helm-chart/ci/{values.name}"' in result.stdout
    assert "All charts linted successfully" in result.stdout


def test_ct_lint_fails_on_a_yamllint_error(tmp_path: Path) -> None:
    """The check above can fail: a copy of the chart with a lint error in a ci file is refused."""
    tools = chart_tools()
    shutil.copytree(CHART, tmp_path / "charts" / "neuron-helm-chart")
    (tmp_path / "charts" / "neuron-helm-chart" / "ci" / "all-on-values.yaml").write_text("tests: {enabled: true}   \n")
    subprocess.run(["git", "init", "-q", "-b", "main", str(tmp_path)], check=True)
    env = dict(os.environ, PATH=f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}")
    result = subprocess.run(
        [tools["CT"], "lint", "--chart-dirs", "charts", "--all", "--validate-maintainers=false",
         "--lint-conf", f"{tools['CT_ETC']}/lintconf.yaml", "--chart-yaml-schema", f"{tools['CT_ETC']}/chart_schema.yaml"],
        cwd=tmp_path, capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    # once (a fresh-clone run of 2026-12-02) ct failed here on something else; the output says what
    assert "trailing spaces" in output, output


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_helm_lint_strict(values: Path) -> None:
    result = helm("lint", "--strict", str(CHART), "-f", str(values))
    assert "0 chart(s) failed" in result.stdout


def _validate(manifests: Path, *version_args: str) -> subprocess.CompletedProcess[str]:
    tools = chart_tools()
    return subprocess.run(
        [tools["KUBECTL_VALIDATE"], str(manifests), *version_args, "--local-crds", tools["CRDS"]],
        capture_output=True, text=True, check=False, env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")},
    )  # fmt: skip


def _kube_versions() -> list[tuple[str, list[str]]]:
    tools = chart_tools()
    # kubectl-validate embeds 1.30's schemas. For the newest release it reads the OpenAPI documents of
    # the pinned k8s.io/kubernetes module (--local-schemas), which take precedence over the embedded ones.
    return [
        ("1.30", ["--version", "1.30"]),
        (tools["OPENAPI_NEWEST_VERSION"], ["--version", "1.30", "--local-schemas", tools["OPENAPI_NEWEST"]]),
    ]


CI_NAMINGS = ["release", "aws"]


def _ci_rendering(values: Path, names: str) -> list[dict[str, Any]]:
    return render("-f", str(values), *MONITORING_API, *NFD_API, *KMM_API, *OPENSHIFT_API, *sets(objectNames=names))


@pytest.fixture(scope="module")
def ci_verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """kubectl-validate once per Kubernetes version over every ci values file's rendering with both namings
    (a file each), not once per rendering: most of a run is loading the schemas (0.6 CPU-seconds for 1.30,
    then 0.1 a rendering). Kubernetes version -> file name -> the validator's result for each object."""
    verdicts: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for version, args in _kube_versions():
        directory = tmp_path_factory.mktemp(f"validate-{version}")
        for values in CI_VALUES:
            for names in CI_NAMINGS:
                _served_by(version, _ci_rendering(values, names), directory, f"{values.stem}.{names}.yaml")
        result = _validate(directory, *args, "--output", "json")
        try:
            by_path = json.loads(result.stdout)
        except json.JSONDecodeError:
            pytest.fail(f"kubectl-validate (Kubernetes {version}) printed no verdicts:\n{result.stdout}{result.stderr}")
        verdicts[version] = {Path(path).name: results for path, results in by_path.items()}
    return verdicts


@pytest.mark.parametrize("names", CI_NAMINGS)
@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_rendered_manifests_validate_against_kubernetes_1_30_and_the_newest(
    values: Path, names: str, ci_verdicts: dict[str, dict[str, list[dict[str, Any]]]]
) -> None:
    """Every variant, with release-scoped names and with AWS's (the default: objects in kube-system and the
    detector's own namespace, which the chart then creates)."""
    docs = _ci_rendering(values, names)
    newest = Path(chart_tools()["OPENAPI_NEWEST"])
    for doc in docs:
        group, _, version = doc["apiVersion"].rpartition("/")
        if "." not in group or (group.endswith(".k8s.io") and group != "nfd.k8s-sigs.io"):
            path = newest / ("apis/" + group if group else "api") / f"{version}.json"
            assert path.exists(), f"{doc['kind']} uses {doc['apiVersion']}, which the newest Kubernetes does not serve"
    for version, by_file in ci_verdicts.items():
        results = by_file.get(f"{values.stem}.{names}.yaml")
        assert results, f"Kubernetes {version}: the validator gave no verdict on this rendering"
        failed = [r for r in results if r.get("status") != "Success"]
        assert not failed, f"Kubernetes {version}:\n{json.dumps(failed, indent=1)}"


# APIs newer than the chart's oldest Kubernetes, used only by components that need them (the DRA
# driver needs 1.34+): their objects are checked against the newest release alone.
NEWER_THAN_1_30 = {"resource.k8s.io/v1"}


def _served_by(version: str, docs: list[dict[str, Any]], directory: Path, name: str) -> None:
    """`docs` as `name` in `directory`, less the objects `version` does not serve."""
    kept = docs if version != "1.30" else [d for d in docs if d["apiVersion"] not in NEWER_THAN_1_30]
    (directory / name).write_text(yaml_streams.dump_all(kept))


def node_enablement_objects(variant: str) -> list[dict[str, Any]]:
    docs = render(*NODE_ENABLEMENT_VARIANTS[variant], *NFD_API, *KMM_API)
    # copies: the checks that the validator can fail break them, and render's results are cached
    return [copy.deepcopy(d) for d in docs if d["apiVersion"].startswith(NODE_ENABLEMENT_GROUPS)]


@pytest.mark.parametrize("variant", NODE_ENABLEMENT_VARIANTS)
def test_every_kmm_and_nfd_object_passes_the_real_crds(variant: str, tmp_path: Path) -> None:
    """The schemas of the pinned NFD release and the vendored KMM release (kubectl-validate --local-crds)."""
    objects = node_enablement_objects(variant)
    assert objects
    manifests = tmp_path / "objects.yaml"
    manifests.write_text(yaml_streams.dump_all(objects))
    result = _validate(manifests, "--version", "1.30")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_crd_check_catches_an_invalid_rule(tmp_path: Path) -> None:
    (rule,) = node_enablement_objects("rule")
    rule["spec"]["rules"][0]["matchFeatures"][0]["matchExpressions"]["vendor"]["op"] = "Equals"
    manifests = tmp_path / "bad.yaml"
    manifests.write_text(yaml.safe_dump(rule))
    result = _validate(manifests, "--version", "1.30")
    assert result.returncode != 0
    assert "Equals" in result.stdout + result.stderr


# Every combination of the values that shape the Module or decide whether it renders, each with one of the
# values that only fill it in (registry, kernel regexp and pull policy, tolerations) in turn.
MODULE_PULL_SECRETS = {
    "no-secret": {},
    "first-global-secret": {"global__imagePullSecrets": ["first", "second"]},
    "own-secret": {"global__imagePullSecrets": ["first"], "driver__imageRepoSecret": "kmm-pull"},
}
MODULE_SELECTORS = {
    "nfd-label": {},
    "other-nfd-label": {"placement__nfdLabel": "example.com/neuron"},
    "own-selector": {
        "placement__mode": "instanceType",
        "driver__nodeSelector": {"a": "b", "kubernetes.io/os": "linux"},
    },
}
MODULE_ORDERINGS = {"plugin-at-once": {}, "plugin-waits": {"driver__devicePluginWaitsForModule": True}}
MODULE_AVAILABILITY = {"api-served": KMM_API, "forced": sets(driver__force=True)}
MODULE_FILLINGS = [
    {"driver__image__registry": "registry.example.internal"},
    {"global__imageRegistry": "mirror.example.internal:5000", "driver__kernelVersionRegexp": "^6\\.1\\..*$",
     "driver__image__pullPolicy": "Always", "driver__tolerations": []},
    {"driver__tolerations": [{"key": "dedicated", "operator": "Equal", "value": "neuron", "effect": "NoExecute",
                              "tolerationSeconds": 60}, {"operator": "Exists"}]},
]  # fmt: skip


def module_combinations() -> dict[str, tuple[tuple[str, str, int], list[str]]]:
    """Name -> (what shapes the Module: pull secret, selector, filling; the render arguments)."""
    combos = itertools.product(MODULE_PULL_SECRETS.items(), MODULE_SELECTORS.items(), MODULE_ORDERINGS.items())
    out: dict[str, tuple[tuple[str, str, int], list[str]]] = {}
    for i, ((secret, s), (selector, sel), (ordering, o)) in enumerate(combos):
        filling = i % len(MODULE_FILLINGS)
        for availability, api in MODULE_AVAILABILITY.items():
            name = f"{secret}.{selector}.{ordering}.{availability}.filling-{filling}"
            out[name] = (
                (secret, selector, filling),
                [*DRIVER, *sets(**s, **sel, **o, **MODULE_FILLINGS[filling]), *api],
            )
    return out


def test_every_module_the_driver_values_can_render_passes_the_real_crd(tmp_path: Path) -> None:
    """KMM's Module CRD of the pinned release (tests/chart/kmm-crds), on each combination, in one validator run."""
    combinations = module_combinations()
    rendered = {name: module(render(*args)) for name, (_, args) in combinations.items()}
    # force and the ordering leave the Module as it is; the pull secret, selector and filling each change it
    shapes = {key: {json.dumps(rendered[name], sort_keys=True) for name, (k, _) in combinations.items() if k == key}
              for key, _ in combinations.values()}  # fmt: skip
    assert all(len(same) == 1 for same in shapes.values())
    assert len(set().union(*shapes.values())) == len(shapes)
    for name, m in rendered.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(m))
    result = _validate(tmp_path, "--version", "1.30", "--output", "json")
    verdicts = {Path(file).stem: [r["status"] for r in results] for file, results in json.loads(result.stdout).items()}
    assert verdicts == {name: ["Success"] for name in combinations}, result.stdout + result.stderr
    assert result.returncode == 0, result.stderr


def test_the_crd_check_catches_an_invalid_module(tmp_path: Path) -> None:
    (m,) = node_enablement_objects("module")
    del m["spec"]["selector"]
    m["spec"]["moduleLoader"]["container"]["kernelMappings"][0]["containerImage"] = 7
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(m))
    result = _validate(tmp_path / "bad.yaml", "--version", "1.30")
    assert result.returncode != 0
    assert "spec.selector" in result.stdout + result.stderr
    assert "containerImage" in result.stdout + result.stderr


def test_the_validator_catches_an_invalid_manifest(tmp_path: Path) -> None:
    docs = copy.deepcopy(render())  # render's results are cached: a change to them would reach later tests
    container(daemonset(docs, "device-plugin"))["securityContext"]["runAsUser"] = "root"
    manifests = tmp_path / "bad.yaml"
    manifests.write_text(yaml_streams.dump_all(docs))
    for version, args in _kube_versions():
        result = _validate(manifests, *args)
        assert result.returncode != 0, f"Kubernetes {version} accepted a string runAsUser"
        assert "runAsUser" in result.stdout + result.stderr


def test_one_validator_run_over_many_renderings_tells_each_its_own_verdict(tmp_path: Path) -> None:
    """What ci_verdicts relies on: a bad rendering beside a good one fails alone, named by its file."""
    good, bad = render(), copy.deepcopy(render())
    container(daemonset(bad, "device-plugin"))["securityContext"]["runAsUser"] = "root"
    _served_by("1.30", good, tmp_path, "good.yaml")
    _served_by("1.30", bad, tmp_path, "bad.yaml")
    result = _validate(tmp_path, "--version", "1.30", "--output", "json")
    verdicts = {Path(path).name: [r["status"] for r in results] for path, results in json.loads(result.stdout).items()}
    assert set(verdicts) == {"good.yaml", "bad.yaml"}
    assert set(verdicts["good.yaml"]) == {"Success"}
    assert verdicts["bad.yaml"].count("Success") == len(verdicts["bad.yaml"]) - 1, verdicts["bad.yaml"]
    assert "runAsUser" in result.stdout


# --- documentation ---------------------------------------------------------------------------


def test_every_value_is_documented_and_the_readme_table_is_current() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "chart_docs.py"), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_every_value_has_a_schema_entry() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], value: Any, path: str) -> None:
        props = node.get("properties")
        if props is None or not isinstance(value, dict):
            return
        for key, child in value.items():
            assert key in props, f"{path}{key} is in values.yaml but not in values.schema.json"
            walk(props[key], child, f"{path}{key}.")

    walk(schema, values, "")


def test_app_version_is_the_services_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["kubeVersion"] == ">=1.30.0-0"
    for pyproject in (REPO / "services").glob("*/pyproject.toml"):
        version = re.search(r'^version = "(.+)"', pyproject.read_text(), re.MULTILINE)
        assert version, pyproject
        assert version[1] == chart["appVersion"], pyproject


# --- host paths come from the node model ----------------------------------------------------------


def test_host_paths_are_the_node_models() -> None:
    """The chart cannot import the host layout, so this checks every host path it writes against it."""
    from neuron_driver import layout

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["kubeletRootDir"] == layout.KUBELET_DIR
    assert values["npd"]["stateHostPath"] == layout.NPD_STATE_DIR
    assert values["devicePlugin"]["cdi"]["specDir"] == layout.CDI_SPEC_DIR
    docs = render()
    plugin = container(daemonset(docs, "device-plugin"))["args"]
    detector = container(daemonset(docs, "problem-detector"))["args"]
    assert f"--device-plugin-path={layout.DEVICE_PLUGIN_DIR.rstrip('/')}" in plugin
    assert f"--pod-resources-socket={layout.POD_RESOURCES_SOCKET}" in plugin
    assert f"--verdict-dir={layout.VERDICT_DIR}" in plugin
    assert f"--verdict-dir={layout.VERDICT_DIR}" in detector
    assert f"--state-file={layout.NPD_STATE_FILE}" in detector


def test_node_metrics_runs_neuron_monitor_only_when_a_command_is_given() -> None:
    args = container(daemonset(render(), "node-metrics"))["args"]
    assert not [a for a in args if a.startswith("--neuron-monitor-command")]  # off by default: sysfs only
    command = "/opt/aws/neuron/bin/neuron-monitor -c '/etc/neuron monitor.json'"
    args = container(daemonset(render(*sets(nodeMetrics__neuronMonitorCommand=command)), "node-metrics"))["args"]
    assert f"--neuron-monitor-command={command}" in args  # one argument, quotes and spaces intact
    assert args.index(f"--neuron-monitor-command={command}") < args.index("--log-level=info")


def _isolated_private_paths() -> list[str]:
    """tests/cluster/isolated.sh's PRIVATE: the host paths the second test cluster has of its own."""
    script = (REPO / "tests/cluster/isolated.sh").read_text()
    found = re.search(r"^PRIVATE=\(([^)]*)\)", script, re.MULTILINE)
    assert found, "isolated.sh has no PRIVATE=(...) list"
    return found.group(1).split()


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=["defaults", *(v.name for v in CI_VALUES)])
def test_every_host_path_the_chart_writes_is_its_own_on_the_second_test_cluster(values: Path | None) -> None:
    """ct installs every ci/ values file on the second test cluster beside the first one's releases:
    a host path the chart writes, outside isolated.sh's private list, would be shared by both
    clusters' pods (a chart default moved, and the list not with it)."""

    def canonical(path: str) -> str:
        return re.sub(r"^/var/run(?=/|$)", "/run", path.rstrip("/"))

    private = [canonical(p) for p in _isolated_private_paths()]
    docs = render(*(["--values", str(values)] if values else []))
    written = set()
    for doc in docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec")
        if not spec:
            continue
        host = {v["name"]: v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v}
        for container in spec.get("initContainers", []) + spec["containers"]:
            for mount in container.get("volumeMounts", []):
                if mount["name"] in host and not mount.get("readOnly"):
                    written.add(canonical(host[mount["name"]]))
    if values is None:  # the default install writes the kubelet's sockets and the verdicts
        assert written, "no writable host path rendered: the walk is wrong"
    shared = sorted(p for p in written if not any(p == q or p.startswith(q + "/") for q in private))
    assert not shared, f"host paths the chart writes that isolated.sh does not make private: {shared}"


@pytest.mark.parametrize("surge", [0, "0%"])
def test_the_dra_driver_rolls_with_a_zero_surge(surge: object) -> None:
    """The default surges (test_dra_chart.py); one node at a time without a surge still renders."""
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": 1}}
    docs = render(*sets(devicePlugin__enabled=False, draDriver__enabled=True, draDriver__updateStrategy=strategy))
    (daemonset,) = [d for d in by_component(docs, "dra-driver") if d["kind"] == "DaemonSet"]
    assert daemonset["spec"]["updateStrategy"] == strategy


@pytest.mark.parametrize("simulation", [False, True], ids=["host", "simulation"])
def test_the_device_reset_mounts_the_reset_nodes_writable_and_podresources_only_when_on(simulation: bool) -> None:
    """docs/remediation.md: the driver's device directory writable inside the read-only host view (the class
    links point into it), the kubelet's PodResources read-only; off, neither, and `--no-device-reset`."""
    root = "/var/lib/neuron-sim/node" if simulation else "/host"
    base = {"simulation__enabled": simulation}
    off = container(daemonset(render(*sets(**base)), "problem-detector"))
    assert "--no-device-reset" in off["args"]
    assert not {"neuron-devices", "pod-resources"} & {m["name"] for m in off["volumeMounts"]}
    docs = render(*sets(**base, npd__remediation__deviceReset={"enabled": True, "validationWindow": 30,
                                                               "validationCommand": "nccom-test -r 2 allr"}))  # fmt: skip
    ds = daemonset(docs, "problem-detector")
    c = container(ds)
    assert [a for a in c["args"] if "reset" in a or "validation" in a or "pod-resources" in a] == [
        "--device-reset",
        "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock",
        "--validation-window=30",
        "--validation-command=nccom-test -r 2 allr",
    ]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["neuron-devices"] == {
        "name": "neuron-devices",
        "mountPath": f"{root}/sys/devices/virtual/neuron_device",
    }
    assert mounts["pod-resources"]["readOnly"] is True
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    host = "/var/lib/neuron-sim/node" if simulation else ""
    assert volumes["neuron-devices"]["hostPath"] == {
        "path": f"{host}/sys/devices/virtual/neuron_device",
        "type": "Directory",
    }


def test_the_validation_after_a_reboot_turns_on_both_sides_with_the_detectors_window_and_command() -> None:
    """docs/remediation.md: one value for the controller's wait and the detector's validation, which takes
    the device reset's window and command without the device reset (no PodResources, no writable mounts)."""
    values = {"remediation__enabled": True, "npd__remediation__deviceReset__validationCommand": "nccom-test -r 2 allr"}
    off = render(*sets(**values))
    assert "--validate-after-reboot" not in container(daemonset(off, "problem-detector"))["args"]
    (controller,) = [d for d in by_component(off, "remediation-controller") if d["kind"] == "Deployment"]
    assert not [a for a in container(controller)["args"] if "validate" in a or "verdict" in a]
    on = render(*sets(**values, remediation__validateAfterReboot=True, remediation__verdictTimeout="30m"))
    detector = container(daemonset(on, "problem-detector"))
    assert [a for a in detector["args"] if "reset" in a or "validat" in a or "pod-resources" in a] == [
        "--no-device-reset",
        "--validate-after-reboot",
        "--validation-window=60",
        "--validation-command=nccom-test -r 2 allr",
    ]
    assert not {"neuron-devices", "pod-resources"} & {m["name"] for m in detector["volumeMounts"]}
    (controller,) = [d for d in by_component(on, "remediation-controller") if d["kind"] == "Deployment"]
    assert [a for a in container(controller)["args"] if "validate" in a or "verdict" in a] == [
        "--validate-after-reboot",
        "--verdict-timeout=30m",
    ]
