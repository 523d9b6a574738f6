"""The chart's admission policy for the DRA driver's opaque configs (issue 58 item 4), on a real
kube-apiserver of every release the driver is tested on: AWS's published ResourceClaimTemplates
(tests/e2e/aws-dra-specs, byte for byte) are admitted, as claims and templates and in a DeviceClass;
a broken NeuronConfig or UltraServerConfig (each way one can be broken) is refused when it is created,
with a message naming the field. Every case's verdict is also the driver's own parser's
(`neuron_dra_driver.parameters.parse`): the policy refuses exactly what any node would refuse at
prepare time for the config alone, and nothing a node could still accept."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart import admission
from chart.test_chart import CHART, render, sets
from neuron_dra_driver import parameters
from simcluster.controlplane import ControlPlane, k8s_release, k8s_version, private_control_plane

from neuron_common.kube import Api

pytestmark = pytest.mark.integration  # starts external processes: make integration

REPO = Path(__file__).resolve().parents[2]
AWS_SPECS = REPO / "tests/e2e/aws-dra-specs"
OLDER = sorted(p.name.removeprefix("k8s-") for p in (REPO / "tests/simcluster").glob("k8s-1.*"))
ON = sets(devicePlugin__enabled=False, draDriver__enabled=True)
POLICY = "neuron-helm-chart-dra-driver-configs"
NS = "default"
RESOURCE = "/apis/resource.k8s.io/v1"
PATHS = {
    "ResourceClaim": f"{RESOURCE}/namespaces/{NS}/resourceclaims",
    "ResourceClaimTemplate": f"{RESOURCE}/namespaces/{NS}/resourceclaimtemplates",
    "DeviceClass": f"{RESOURCE}/deviceclasses",
}
# where each kind keeps its configs, as the message names them
CONFIG_AT = {
    "ResourceClaim": "spec.devices.config",
    "ResourceClaimTemplate": "spec.spec.devices.config",
    "DeviceClass": "spec.config",
}
V1 = "neuron.aws.com/v1"

# (name, parameters, the field the refusal names, or None where it is admitted)
CASES: list[tuple[str, Any, str | None]] = [
    ("lnc 1", {"apiVersion": V1, "kind": "NeuronConfig", "logicalNeuronCore": 1}, None),
    ("lnc 2, an older apiVersion", {"apiVersion": "neuron.aws.com/v1alphav1", "kind": "NeuronConfig", "logicalNeuronCore": 2}, None),
    ("lnc unset: the node's", {"apiVersion": "resource.neuron.aws.com/v1alphav1", "kind": "NeuronConfig"}, None),
    ("ultraserver 4", {"apiVersion": V1, "kind": "UltraServerConfig", "ultraserverMode": 4}, None),
    ("unknown apiVersion", {"apiVersion": "neuron.aws.com/v2", "kind": "NeuronConfig", "logicalNeuronCore": 1}, "apiVersion"),
    ("no apiVersion", {"kind": "NeuronConfig", "logicalNeuronCore": 1}, "apiVersion"),
    ("unknown kind", {"apiVersion": V1, "kind": "NeuronSettings", "logicalNeuronCore": 1}, "kind"),
    ("kind not a string", {"apiVersion": V1, "kind": 7}, "kind"),
    ("kind a list", {"apiVersion": V1, "kind": ["NeuronConfig"]}, "kind"),
    ("apiVersion an object", {"apiVersion": {"group": "neuron.aws.com"}, "kind": "NeuronConfig"}, "apiVersion"),
    ("lnc null: unset", {"apiVersion": V1, "kind": "NeuronConfig", "logicalNeuronCore": None}, None),
    ("unknown field", {"apiVersion": V1, "kind": "NeuronConfig", "logicalNeuronCores": 1}, "logicalNeuronCores"),
    ("the other kind's field", {"apiVersion": V1, "kind": "NeuronConfig", "ultraserverMode": 2}, "ultraserverMode"),
    ("lnc no family accepts", {"apiVersion": V1, "kind": "NeuronConfig", "logicalNeuronCore": 4}, "logicalNeuronCore"),
    ("lnc as a string", {"apiVersion": V1, "kind": "NeuronConfig", "logicalNeuronCore": "1"}, "logicalNeuronCore"),
    ("lnc as a fraction", {"apiVersion": V1, "kind": "NeuronConfig", "logicalNeuronCore": 1.5}, "logicalNeuronCore"),
    ("lnc as a boolean", {"apiVersion": V1, "kind": "NeuronConfig", "logicalNeuronCore": True}, "logicalNeuronCore"),
    ("ultraserver 3", {"apiVersion": V1, "kind": "UltraServerConfig", "ultraserverMode": 3}, "ultraserverMode"),
    # the API server's own validation refuses it, naming the field, before any policy sees it
    ("not an object", ["NeuronConfig"], "parameters"),
]  # fmt: skip


def aws_templates() -> list[dict[str, Any]]:
    docs = [d for p in sorted(AWS_SPECS.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    return [d for d in docs if d["kind"] == "ResourceClaimTemplate"]


def claim_template(name: str, params: Any, driver: str = parameters.DRIVER) -> dict[str, Any]:
    """A template of one request for a whole device, configured with `params` (after a config of another driver)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "neurons", "exactly": {"deviceClassName": "neuron.aws.com"}}],
                    "config": [
                        {"opaque": {"driver": "gpu.example.com", "parameters": {"anything": "goes"}}},
                        {"requests": ["neurons"], "opaque": {"driver": driver, "parameters": params}},
                    ],
                }
            }
        },
    }


def as_kind(template: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    """The template as a ResourceClaim (its claim spec), a DeviceClass (its configs), or itself."""
    template = copy.deepcopy(template)
    meta = {"name": name}
    if kind == "ResourceClaimTemplate":
        return {**template, "metadata": meta}
    spec = template["spec"]["spec"]
    if kind == "ResourceClaim":
        return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": meta, "spec": spec}
    configs = [{"opaque": c["opaque"]} for c in spec["devices"].get("config", [])]  # a class's apply to all requests
    selector = {"cel": {"expression": 'device.driver == "neuron.aws.com"'}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind,
        "metadata": meta,
        "spec": {"selectors": [selector], "config": configs},
    }


def driver_verdict(params: Any) -> str | None:
    """The driver's parser on `params`: None when a node could apply it, else its message."""
    try:
        parameters.parse(params, "config")
    except parameters.ConfigError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module", params=["pinned", *OLDER])
def apiserver(request: pytest.FixtureRequest) -> Iterator[tuple[str, ControlPlane]]:
    """A control plane of each release, with the chart's policy created and enforced; before it, a
    DeviceClass with a config the policy refuses (`legacy`), as one admitted before the chart was installed."""
    release = k8s_release(f"v{request.param}") if request.param != "pinned" else contextlib.nullcontext()
    with contextlib.ExitStack() as stack:
        # the release is chosen only while the processes start: every other test keeps the pinned one
        with release:  # not built: the control plane fails the test, naming make setup
            version = k8s_version()
            cp = stack.enter_context(private_control_plane(f"dra-config-{version}-"))
        asyncio.run(_install(cp))
        yield version, cp


LEGACY = as_kind(claim_template("legacy", CASES[-2][1]), "DeviceClass", "legacy")


async def _install(cp: ControlPlane) -> None:
    admin = Api(cp.server, ssl_context=cp.credentials.ssl_context())
    try:
        await admin.create(PATHS["DeviceClass"], LEGACY)
        policy = [d for d in render(*ON) if d["kind"] in admission.PATHS and d["metadata"]["name"] == POLICY]
        assert sorted(d["kind"] for d in policy) == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
        for doc in policy:
            await admin.create(admission.PATHS[doc["kind"]], doc)
        probe = claim_template("probe", {"apiVersion": V1, "kind": "NeuronConfig", "logicalNeuronCore": 3})
        await admission.until_enforced(
            lambda: admin.create(PATHS["ResourceClaimTemplate"], probe), "logicalNeuronCore", status=422
        )
    finally:
        await admin.close()


async def _attempts(cp: ControlPlane, objects: dict[str, dict[str, Any]]) -> dict[str, str]:
    admin = Api(cp.server, ssl_context=cp.credentials.ssl_context())
    try:
        return await admission.outcomes({name: admin.create(PATHS[o["kind"]], o) for name, o in objects.items()})
    finally:
        await admin.close()


def test_aws_published_templates_are_admitted(apiserver: tuple[str, ControlPlane]) -> None:
    version, cp = apiserver
    templates = aws_templates()
    with_config = [t for t in templates if t["spec"]["spec"]["devices"].get("config")]
    assert len(templates) == 7, [t["metadata"]["name"] for t in templates]
    assert len(with_config) == 4, [t["metadata"]["name"] for t in with_config]
    objects = {
        f"{kind} {t['metadata']['name']}": as_kind(t, kind, f"aws-{kind.lower()}-{t['metadata']['name']}")
        for t in with_config
        for kind in PATHS
    }
    objects |= {f"as published: {t['metadata']['name']}": t for t in templates}
    outcomes = asyncio.run(_attempts(cp, objects))
    assert set(outcomes.values()) == {"allowed"}, (version, outcomes)


@pytest.mark.parametrize("kind", list(PATHS))
def test_each_broken_config_is_refused_naming_its_field(apiserver: tuple[str, ControlPlane], kind: str) -> None:
    version, cp = apiserver
    prefix = kind.lower().replace("resource", "r")
    objects = {
        name: as_kind(claim_template("x", params), kind, f"{prefix}-{i}") for i, (name, params, _) in enumerate(CASES)
    }
    outcomes = asyncio.run(_attempts(cp, objects))
    at = f"{CONFIG_AT[kind]}[1].opaque.parameters"  # the first config is another driver's
    for name, params, field in CASES:
        outcome, driver = outcomes[name], driver_verdict(params)
        if field is None:
            assert outcome == "allowed", (version, kind, name, outcome)
            assert driver is None, (name, driver)
            continue
        assert driver is not None, f"{name}: the driver's parser accepts what the policy refuses"
        assert outcome.startswith("422 "), (version, kind, name, outcome)
        if field == "parameters":
            assert f"{at}: Invalid value" in outcome, (version, kind, name, outcome)
        else:
            assert f"invalid neuron.aws.com device config: {at}.{field}: " in outcome, (version, kind, name, outcome)


def test_another_drivers_config_is_left_alone(apiserver: tuple[str, ControlPlane]) -> None:
    version, cp = apiserver
    broken = {"apiVersion": V1, "kind": "NeuronConfig", "logicalNeuronCore": 3}
    objects = {
        kind: as_kind(claim_template("x", broken, driver="gpu.example.com"), kind, f"other-{kind.lower()}")
        for kind in PATHS
    }
    assert set(asyncio.run(_attempts(cp, objects)).values()) == {"allowed"}, version


def test_an_object_admitted_before_the_policy_can_still_be_updated_but_not_its_configs(
    apiserver: tuple[str, ControlPlane],
) -> None:
    version, cp = apiserver

    async def scenario() -> dict[str, str]:
        admin = Api(cp.server, ssl_context=cp.credentials.ssl_context())
        path = f"{PATHS['DeviceClass']}/legacy"
        try:
            current = await admin.get(path)
            relabelled = copy.deepcopy(current)
            relabelled["metadata"].setdefault("labels", {})["team"] = "a"
            answers = await admission.outcomes({"a label": admin.update(path, relabelled)})
            current = await admin.get(path)
            reconfigured = copy.deepcopy(current)
            reconfigured["spec"]["config"][1]["opaque"]["parameters"]["ultraserverMode"] = 5
            answers |= await admission.outcomes({"its configs": admin.update(path, reconfigured)})
            return answers
        finally:
            await admin.close()

    answers = asyncio.run(scenario())
    assert answers["a label"] == "allowed", (version, answers)
    assert answers["its configs"].startswith("422 "), (version, answers)
    assert "spec.config[1].opaque.parameters.ultraserverMode: 5 is not 2 or 4" in answers["its configs"], answers


BETAS = ("v1beta1", "v1beta2")  # off by default since 1.34, but a cluster may serve them beside v1


def test_a_config_written_through_a_beta_version_is_checked_as_v1() -> None:
    """matchPolicy Equivalent: a template created through resource.k8s.io/v1beta1 or v1beta2 is
    converted to v1, where the policy reads its configs, before it is checked."""
    runtime = ",".join(f"resource.k8s.io/{v}=true" for v in BETAS)

    async def scenario(cp: ControlPlane) -> dict[str, str]:
        await _install(cp)
        admin = Api(cp.server, ssl_context=cp.credentials.ssl_context())
        attempts = {}
        try:
            for version in BETAS:
                for lnc in (1, 3):
                    config = {"opaque": {"driver": parameters.DRIVER, "parameters": {"apiVersion": V1, "kind": "NeuronConfig", "logicalNeuronCore": lnc}}}  # fmt: skip
                    body = {
                        "apiVersion": f"resource.k8s.io/{version}",
                        "kind": "ResourceClaimTemplate",
                        "metadata": {"name": f"{version}-lnc{lnc}"},
                        "spec": {"spec": {"devices": {"config": [config]}}},
                    }
                    path = f"/apis/resource.k8s.io/{version}/namespaces/{NS}/resourceclaimtemplates"
                    attempts[f"{version} lnc {lnc}"] = admin.create(path, body)
            return await admission.outcomes(attempts)
        finally:
            await admin.close()

    with private_control_plane("dra-config-betas-", apiserver_args=[f"--runtime-config={runtime}"]) as cp:
        outcomes = asyncio.run(scenario(cp))
    for version in BETAS:
        assert outcomes[f"{version} lnc 1"] == "allowed", outcomes
        refused = outcomes[f"{version} lnc 3"]
        assert refused.startswith("422 "), outcomes
        assert "spec.spec.devices.config[0].opaque.parameters.logicalNeuronCore: 3" in refused, outcomes


def test_the_policy_is_rendered_only_with_the_driver_and_can_be_turned_off() -> None:
    def names(*args: str) -> set[str]:
        return {d["metadata"]["name"] for d in render(*args) if d["kind"] in admission.PATHS}

    assert POLICY in names(*ON)
    assert POLICY not in names()
    assert POLICY not in names(*ON, *sets(draDriver__configPolicy__enabled=False))


def test_the_facts_file_is_the_drivers() -> None:
    """files/dra-opaque-config.yaml is what `make dra-config` writes from the driver's parser, whose
    logical-core values are every value some family of the node model accepts."""
    from neuron_model.instance_types import FAMILIES

    facts = yaml.safe_load((CHART / "files/dra-opaque-config.yaml").read_text())
    assert facts == parameters.admission_facts(), "files/dra-opaque-config.yaml is stale: run `make dra-config`"
    accepted = sorted({v for f in FAMILIES.values() for v in f.supported_lnc})
    assert facts["kinds"]["NeuronConfig"]["logicalNeuronCore"] == accepted
