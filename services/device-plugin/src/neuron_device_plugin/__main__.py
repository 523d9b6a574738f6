"""`neuron-device-plugin` entry point."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from neuron_common import lifecycle, logs
from neuron_device_plugin import config as config_mod
from neuron_device_plugin.config import API_TIMEOUT


def main(argv: Sequence[str] | None = None) -> int:
    config = config_mod.parse(argv)
    logs.configure("neuron-device-plugin", config.log_level)
    api = None
    needed_by = " and ".join(
        flag
        for flag, on in (
            ("--node-report", config.node_report),
            ("--ultraserver-labels", config.ultraserver_labels),
            ("--metrics-auth", config.metrics_security is not None),
        )
        if on
    )
    if needed_by:
        from neuron_common.kube import api_at_start

        api = api_at_start("neuron-device-plugin", config.kubeconfig, API_TIMEOUT, needed_by)
    from neuron_device_plugin.app import Plugin

    return lifecycle.run(lambda stop: Plugin(config, stop, api=api).run())


if __name__ == "__main__":
    sys.exit(main())
