"""AWS's `npd.nodeRecovery.*` in this chart (issue 56): `enabled=true` is taken with its meaning and
selects the remediation controller's Auto Scaling backend, which the real controller parses from the
rendered arguments; `extraEnvs` reaches the process that calls AWS; `image`, `resources` and
`counters` are each refused by name with what to write instead; a contradiction fails."""

from __future__ import annotations

import json

import pytest
from chart.test_chart import refusal, render, sets
from chart.test_remediation_chart import ON, args_of, deployment, owned

from neuron_remediation import config
from neuron_remediation.replacement import AutoScalingBackend, NoBackend, make

pytestmark = pytest.mark.integration  # helm

ENV = {"POD_NAMESPACE": "neuron", "POD_NAME": "r-0"}


def test_node_recovery_enabled_selects_the_autoscaling_backend() -> None:
    docs = render(*ON, *sets(npd__nodeRecovery__enabled=True))
    args = args_of(docs)
    assert "--replacement-backend=autoscaling" in args
    parsed = config.parse(args, ENV)
    assert parsed.replacement_backend == "autoscaling"
    backend = make(parsed)
    assert isinstance(backend, AutoScalingBackend)
    assert (backend.respect_grace_period, backend.reboot) == (False, False)
    # and without it, no backend: the default the chart renders is the flag's
    assert isinstance(make(config.parse(args_of(render(*ON)), ENV)), NoBackend)
    assert not any(a.startswith("--replacement-backend") for a in args_of(render(*ON)))


def test_the_autoscaling_values_render_their_flags() -> None:
    values = {
        "enabled": True, "region": "us-west-2", "endpoint": "https://vpce-1.autoscaling.us-west-2.vpce.amazonaws.com",
        "stsEndpoint": "https://vpce-2.sts.us-west-2.vpce.amazonaws.com", "respectGracePeriod": True, "reboot": True,
    }  # fmt: skip
    args = args_of(render(*ON, "--set-json", f"remediation.autoscaling={json.dumps(values)}"))
    parsed = config.parse(args, ENV)
    assert (parsed.replacement_backend, parsed.aws_region, parsed.autoscaling_endpoint, parsed.sts_endpoint) == (
        "autoscaling", values["region"], values["endpoint"], values["stsEndpoint"],
    )  # fmt: skip
    assert parsed.respect_grace_period
    assert parsed.autoscaling_reboot


def test_extra_envs_reach_the_controller_and_the_role_arn_its_service_account() -> None:
    env = [{"name": "AWS_STS_REGIONAL_ENDPOINTS", "value": "regional"}]
    arn = "arn:aws:iam::111122223333:role/neuron-remediator"
    docs = render(
        *ON, *sets(npd__nodeRecovery__enabled=True),
        "--set-json", f"npd.nodeRecovery.extraEnvs={json.dumps(env)}",
        "--set-json", f'remediation.serviceAccount.annotations={json.dumps({"eks.amazonaws.com/role-arn": arn})}',
    )  # fmt: skip
    (c,) = deployment(docs)["spec"]["template"]["spec"]["containers"]
    assert env[0] in c["env"]
    (sa,) = owned(docs, "ServiceAccount")
    assert sa["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": arn}
    assert deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_node_recovery_without_the_controller_fails_saying_so() -> None:
    message = refusal(*sets(npd__nodeRecovery__enabled=True))
    assert "npd.nodeRecovery.enabled=true -> also set remediation.enabled=true" in message
    message = refusal(*sets(remediation__autoscaling__enabled=True))
    assert "remediation.autoscaling.enabled=true needs remediation.enabled=true" in message
    # enabled=false is AWS's monitor-only: accepted, and nothing asks Auto Scaling
    assert "--replacement-backend=autoscaling" not in args_of(render(*ON, *sets(npd__nodeRecovery__enabled=False)))


@pytest.mark.parametrize(
    ("key", "value", "instead"),
    [
        ("image", {"repository": "public.ecr.aws/neuron/neuron-node-recovery", "tag": "1.11.0"}, "remediation.image"),
        ("resources", {"limits": {"cpu": "10m", "memory": "150Mi"}}, "remediation.resources"),
        ("counters", ["NeuronHasError_SRAM_UNCORRECTABLE_ERROR"], "the fault table's replace rung"),
    ],
)
def test_each_other_node_recovery_key_is_refused_by_name(key: str, value: object, instead: str) -> None:
    message = refusal(
        *ON, *sets(npd__nodeRecovery__enabled=True), "--set-json", f"npd.nodeRecovery.{key}={json.dumps(value)}"
    )
    (line,) = [x for x in message.splitlines() if x.strip().startswith(f"npd.nodeRecovery.{key} -> ")]
    assert instead in line
    assert "additional properties" not in message
