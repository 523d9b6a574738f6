"""Flags, their environment twins, and the checks made at start."""

from __future__ import annotations

import pytest
from flag_errors import refusal
from processes import run_module

from neuron_common.leader import Lease
from neuron_scheduler_extender import config as config_mod


def test_defaults() -> None:
    cfg = config_mod.parse([], env={"POD_NAME": "ext-0", "POD_NAMESPACE": "neuron"})
    assert cfg.listen == ("0.0.0.0", 9843)
    assert cfg.report_max_age == 120.0
    assert cfg.group_reservation_ttl == 120.0
    assert config_mod.parse(["--group-reservation-ttl=30s"], env={}).group_reservation_ttl == 30.0
    assert cfg.resource_prefix == "aws.amazon.com"
    assert cfg.evict_degraded_groups is False  # a degraded group is only reported unless asked
    assert config_mod.parse(["--evict-degraded-groups"], env={}).evict_degraded_groups is True
    on = {"NEURON_EXTENDER_EVICT_DEGRADED_GROUPS": "true"}
    assert config_mod.parse([], env=on).evict_degraded_groups is True
    assert config_mod.parse(["--no-evict-degraded-groups"], env=on).evict_degraded_groups is False
    assert cfg.leader_elect is True
    assert (cfg.lease_namespace, cfg.lease_name) == ("neuron", "neuron-scheduler-extender")
    assert (cfg.lease_duration, cfg.renew_deadline, cfg.retry_period) == (15.0, 10.0, 2.0)
    assert cfg.identity.startswith("ext-0_")
    assert cfg.identity != config_mod.parse([], env={"POD_NAME": "ext-0"}).identity, "unique per process"
    assert cfg.lease == Lease("neuron", "neuron-scheduler-extender", cfg.identity, 15.0, 10.0, 2.0)
    assert str(cfg.lease) == "neuron/neuron-scheduler-extender"


def test_flags_then_environment_then_defaults() -> None:
    env = {"NEURON_EXTENDER_REPORT_MAX_AGE": "90s", "NEURON_EXTENDER_LEADER_ELECT": "false", "POD_NAMESPACE": "x"}
    cfg = config_mod.parse(["--report-max-age=5m", "--lease-namespace=y"], env=env)
    assert cfg.report_max_age == 300.0
    assert cfg.leader_elect is False
    assert cfg.lease_namespace == "y"
    assert config_mod.parse([], env=env).report_max_age == 90.0


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--report-max-age=0"], {}, "must be greater than 0"),
        (["--report-max-age=soon"], {}, "--report-max-age"),
        (
            [],
            {"NEURON_EXTENDER_API_TIMEOUT": "-1s"},
            "environment variable NEURON_EXTENDER_API_TIMEOUT='-1s' is invalid",
        ),
        (["--renew-deadline=20s"], {}, "--renew-deadline (20s) must be shorter than --lease-duration (15s)"),
        (["--retry-period=10s"], {}, "--retry-period (10s) must be shorter than --renew-deadline (10s)"),
        (["--resource-prefix=kubernetes.io"], {}, "is not a valid DNS subdomain outside kubernetes.io"),
        (["--listen=9843"], {}, "expected host:port"),
    ],
)
def test_bad_values_stop_the_service_with_a_message(
    argv: list[str], env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refusal(lambda: config_mod.parse(argv, env=env), capsys)


def test_timing_checks_do_not_apply_without_leader_election() -> None:
    assert config_mod.parse(["--no-leader-elect", "--renew-deadline=20s"], env={}).leader_elect is False


@pytest.mark.integration
def test_help_names_every_flag_and_its_variable() -> None:
    result = run_module("neuron_scheduler_extender", "--help")
    assert result.returncode == 0
    for flag in ("--report-max-age", "--resource-prefix", "--leader-elect", "--lease-duration", "--listen"):
        assert flag in result.stdout
    assert "NEURON_EXTENDER_REPORT_MAX_AGE" in result.stdout
    assert "DURATION is written as in Go and Kubernetes" in result.stdout
