"""Flags, their environment twins, and the checks made at start."""

from __future__ import annotations

import pytest
from flag_errors import refusal
from processes import run_module

from neuron_common.leader import Lease
from neuron_remediation import config as config_mod
from neuron_remediation.drain import BarePods, Mode, NamespacePolicy, Scope
from neuron_remediation.planner import Safety


def test_defaults() -> None:
    cfg = config_mod.parse([], env={"POD_NAME": "rem-0", "POD_NAMESPACE": "neuron"})
    assert cfg.listen == ("0.0.0.0", 9845)
    assert cfg.safety == Safety(max_nodes=1, max_percent=25.0, rate_limit=3, rate_window=3600.0)
    assert cfg.policy.default == NamespacePolicy()
    assert cfg.policy.namespaces == {}
    assert (cfg.policy.bare_pods, cfg.policy.scope) == (BarePods.DELETE, Scope.NEURON)
    assert cfg.policy.keep_namespaces == frozenset({"neuron"}), "the stack's own pods stay"
    assert cfg.lease == Lease("neuron", "neuron-remediation", cfg.identity, 15.0, 10.0, 2.0)
    assert cfg.identity.startswith("rem-0_")
    assert cfg.leader_elect is True
    assert cfg.approval is False


def test_flags_then_environment_then_defaults() -> None:
    env = {
        "NEURON_REMEDIATION_MAX_PERCENT": "10",
        "NEURON_REMEDIATION_APPROVAL": "true",
        "NEURON_REMEDIATION_NAMESPACE_DRAIN_POLICY": "train=finish:2h",
        "NEURON_REMEDIATION_REPLACEMENT": "condition",
    }
    cfg = config_mod.parse(["--max-percent=50", "--drain-pods=all", "--bare-pods=refuse"], env=env)
    assert cfg.safety.max_percent == 50.0
    assert cfg.safety.approval is True
    assert cfg.safety.request_annotation is False
    assert cfg.policy.namespaces == {"train": NamespacePolicy(Mode.FINISH, 7200.0)}
    assert (cfg.policy.scope, cfg.policy.bare_pods) == (Scope.ALL, BarePods.REFUSE)
    assert config_mod.parse([], env=env).safety.max_percent == 10.0
    assert config_mod.parse(["--no-approval"], env=env).safety.approval is False
    keep = config_mod.parse(["--keep-namespaces=a, b"], env={"POD_NAMESPACE": "neuron"}).policy.keep_namespaces
    assert keep == frozenset({"a", "b"})


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--max-percent=0"], {}, "must be greater than 0 and at most 100"),
        (["--max-percent=150"], {}, "at most 100"),
        (["--max-nodes=0"], {}, "must be greater than 0"),
        (["--rate-window=soon"], {}, "--rate-window"),
        (["--drain-policy=drop"], {}, "the mode is evict"),
        (["--namespace-drain-policy=train"], {}, "expected <namespace>=<mode>"),
        ([], {"NEURON_REMEDIATION_DRAIN_POLICY": "finish"}, "NEURON_REMEDIATION_DRAIN_POLICY='finish' is invalid"),
        (["--bare-pods=keep"], {}, "invalid choice"),
        (["--replacement=aws"], {}, "invalid choice"),
        (["--renew-deadline=20s"], {}, "--renew-deadline (20s) must be shorter than --lease-duration (15s)"),
        (["--lease-name="], {}, "--lease-name must not be empty"),
        (["--metrics-auth=kubernetes"], {}, "needs --tls-cert-file"),
    ],
)
def test_bad_values_stop_the_service_with_a_message(
    argv: list[str], env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refusal(lambda: config_mod.parse(argv, env=env), capsys)


@pytest.mark.integration
def test_help_names_every_flag_and_its_variable() -> None:
    result = run_module("neuron_remediation", "--help")
    assert result.returncode == 0, result.stderr
    for flag in ("--max-nodes", "--max-percent", "--rate-limit", "--approval", "--drain-policy", "--bare-pods",
                 "--drain-pods", "--namespace-drain-policy", "--replacement", "--leader-elect", "--listen"):  # fmt: skip
        assert flag in result.stdout
    assert "NEURON_REMEDIATION_MAX_PERCENT" in result.stdout
    assert "25 % of 4 nodes is 1" in result.stdout


@pytest.mark.integration
def test_without_credentials_it_stops_with_a_clear_error() -> None:
    result = run_module("neuron_remediation", env={"KUBERNETES_SERVICE_HOST": "", "KUBERNETES_SERVICE_PORT": ""})
    assert result.returncode == 2
    assert "neuron-remediator: error: cannot reach the API server through the in-cluster service account" in (
        result.stderr
    )
