"""The command itself: --help, validation of flags and environment, SIGTERM during an RPC."""

from __future__ import annotations

import asyncio
import functools
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from grpc import aio
from processes import run_module
from standins.kubelet import FakeKubelet

from kubelet_api.deviceplugin.v1beta1 import api_pb2 as dp
from kubelet_api.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from neuron_device_plugin import config
from neuron_sim import node as sim

run = functools.partial(run_module, "neuron_device_plugin")


@pytest.mark.integration
def test_help_names_every_flag_and_its_environment_twin() -> None:
    out = run("--help")
    assert out.returncode == 0
    for flag in ("--host-root", "--device-plugin-path", "--pod-resources-socket", "--listen", "--log-level"):
        assert flag in out.stdout
    assert "NEURON_DP_HOST_ROOT" in out.stdout
    assert "default: /var/lib/kubelet/device-plugins/" in out.stdout


@pytest.mark.integration
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--listen", "nowhere"], {}, "expected host:port"),
        (["--health-interval", "0"], {}, "must be greater than 0"),
        (["--health-interval", "abc"], {}, "--health-interval: expected a duration like 500ms, 2s or 5m, got 'abc'"),
        (["--log-level", "loud"], {}, "must be debug, info, warning or error"),
        ([], {"NEURON_DP_HEALTH_INTERVAL": "soon"}, "NEURON_DP_HEALTH_INTERVAL='soon' is invalid"),
        ([], {"NEURON_DP_CDI": "maybe"}, "must be true or false"),
        (["--resource-prefix", "kubernetes.io"], {}, "not a valid DNS subdomain"),
        (["--health-quiet-period", "0.1", "--health-interval", "1"], {}, "at least --health-interval"),
    ],
)
def test_bad_configuration_is_a_clear_error(args: list[str], env: dict[str, str], message: str) -> None:
    out = run(*args, env=env)
    assert out.returncode == 2
    assert message in out.stderr


def test_environment_twins_apply_and_flags_win() -> None:
    cfg = config.parse([], env={"NEURON_DP_HOST_ROOT": "/host", "NEURON_DP_NEURONDEVICE_ALIAS": "true"})
    assert cfg.host_root == Path("/host")
    assert cfg.host_dev_root == Path("/host")
    assert [r.name for r in cfg.resources] == ["neuron", "neuroncore", "neurondevice"]
    cfg = config.parse(["--host-root", "/other", "--host-dev-root", "/"], env={"NEURON_DP_HOST_ROOT": "/host"})
    assert (cfg.host_root, cfg.host_dev_root) == (Path("/other"), Path("/"))
    assert config.parse(["--kmsg-path", "none"], env={}).kmsg_path is None


DURATIONS = {  # flag: Config attribute
    "--health-interval": "health_interval",
    "--health-quiet-period": "health_quiet_period",
    "--holdings-interval": "holdings_interval",
    "--pending-ttl": "pending_ttl",
    "--shutdown-drain": "shutdown_drain",
    "--register-timeout": "register_timeout",
    "--node-report-interval": "node_report_interval",
    "--heartbeat-stale-after": "heartbeat_stale_after",
}


def test_every_duration_flag_is_listed_here() -> None:
    help_text = config.parser({}).format_help()
    assert set(re.findall(r"(--[\w-]+) DURATION", help_text)) == set(DURATIONS)


@pytest.mark.parametrize("flag", sorted(DURATIONS))
def test_durations_are_written_the_kubernetes_way(flag: str) -> None:
    variable = config.parser({}).env_name(flag)
    assert getattr(config.parse([flag, "500ms"], env={}), DURATIONS[flag]) == 0.5
    assert getattr(config.parse([], env={variable: "500ms"}), DURATIONS[flag]) == 0.5
    assert getattr(config.parse([flag, "0.5"], env={}), DURATIONS[flag]) == 0.5  # the chart passes numbers


def test_duration_defaults() -> None:
    cfg = config.parse([], env={})
    assert (cfg.health_interval, cfg.health_quiet_period, cfg.holdings_interval) == (0.5, 300.0, 5.0)
    assert cfg.shutdown_drain == 2.0
    assert (cfg.pending_ttl, cfg.register_timeout) == (60.0, 10.0)
    assert cfg.heartbeat_stale_after == 300.0  # neuron_health.pipeline.HEARTBEAT_STALE_AFTER


@pytest.mark.integration
async def test_sigterm_during_list_and_watch_exits_cleanly(short_tmp: Path) -> None:
    root = short_tmp / "node"
    sim.create(root, "trn1.2xlarge")
    kubelet = FakeKubelet(short_tmp / "dp", short_tmp / "pr")
    await kubelet.start()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "neuron_device_plugin",
        "--host-root", str(root),
        "--device-plugin-path", str(short_tmp / "dp"),
        "--pod-resources-socket", str(kubelet.pod_resources_socket),
        "--listen", "127.0.0.1:0",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await kubelet.wait_registered(["aws.amazon.com/neuron", "aws.amazon.com/neuroncore"], timeout=30)
        async with aio.insecure_channel(f"unix://{kubelet.endpoints['aws.amazon.com/neuron'].socket}") as ch:
            stream = dp_grpc.DevicePluginStub(ch).ListAndWatch(dp.Empty())
            await stream.read()  # an RPC in flight
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 15)
        assert code == 0
        assert time.monotonic() - started < 10
        assert not list((short_tmp / "dp").glob("neuron-*.sock"))
        assert proc.stderr is not None
        logs = (await proc.stderr.read()).decode()
        assert '"msg":"received SIGTERM: shutting down"' in logs
        assert '"level":"error"' not in logs
    finally:
        if proc.returncode is None:
            proc.kill()
        await kubelet.stop()


def test_kernel_log_format() -> None:
    cfg = config.parse(["--kernel-log-format", "syslog", "--kmsg-path", "/host/var/log/messages"], env={})
    assert (cfg.kernel_log_format, cfg.kmsg_path) == ("syslog", Path("/host/var/log/messages"))
    assert config.parse([], env={}).kernel_log_format == "kmsg"
    with pytest.raises(SystemExit):
        config.parse(["--kernel-log-format", "syslog"], env={})
    with pytest.raises(SystemExit):
        config.parse([], env={"NEURON_DP_KERNEL_LOG_FORMAT": "journal"})
