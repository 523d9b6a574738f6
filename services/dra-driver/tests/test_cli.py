"""Flags, their environment twins, and clear errors at start."""

from __future__ import annotations

from pathlib import Path

import pytest
from flag_errors import refusal
from neuron_dra_driver import config


def test_defaults_are_the_kubelets_paths() -> None:
    c = config.parse([], env={"NODE_NAME": "node-a"})
    assert c.node_name == "node-a"
    assert c.dra_socket == Path("/var/lib/kubelet/plugins/neuron.aws.com/dra.sock")
    assert c.registration_socket == Path("/var/lib/kubelet/plugins_registry/neuron.aws.com-reg.sock")
    assert c.checkpoint_file == Path("/var/lib/kubelet/plugins/neuron.aws.com/checkpoint.json")
    assert c.cdi_spec_dir == Path("/var/run/cdi")
    assert c.publish_cores is True
    assert c.host_dev_root == Path("/")


def test_environment_twins() -> None:
    c = config.parse(
        [],
        env={
            "NEURON_DRA_NODE_NAME": "n1",
            "NEURON_DRA_PUBLISH_CORES": "false",
            "NEURON_DRA_HOST_ROOT": "/host",
            "NEURON_DRA_HOST_DEV_ROOT": "/",
            "NEURON_DRA_KMSG_PATH": "none",
        },
    )
    assert (c.node_name, c.publish_cores, c.host_root, c.host_dev_root, c.kmsg_path) == (
        "n1",
        False,
        Path("/host"),
        Path("/"),
        None,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "node's name is needed"),
        (["--node-name", "Node_A"], "not a node name"),
        (["--node-name", "a", "--health-interval", "10s", "--health-quiet-period", "1s"], "quiet-period"),
    ],
)
def test_clear_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert message in refusal(lambda: config.parse(argv, env={}), capsys)
