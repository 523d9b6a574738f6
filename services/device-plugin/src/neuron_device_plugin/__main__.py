"""`neuron-device-plugin` entry point."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from neuron_common import lifecycle, logs
from neuron_device_plugin import config as config_mod


def main(argv: Sequence[str] | None = None) -> int:
    config = config_mod.parse(argv)
    logs.configure("neuron-device-plugin", config.log_level)
    api = None
    if config.node_report:
        from neuron_device_plugin.node_report import ReportSetupError, api_client

        try:
            api = api_client(config.kubeconfig)  # no credentials is a clear error at start, not a crash later
        except ReportSetupError as exc:
            print(f"neuron-device-plugin: error: {exc}", file=sys.stderr)
            return 2

    async def run(stop: asyncio.Event) -> int:
        from neuron_device_plugin.app import Plugin

        return await Plugin(config, stop, api=api).run()

    return lifecycle.run(run)


if __name__ == "__main__":
    sys.exit(main())
