"""`neuron-node-metrics` entry point."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from neuron_common import lifecycle, logs
from neuron_node_metrics import config as config_mod


def main(argv: Sequence[str] | None = None) -> int:
    config = config_mod.parse(argv)
    if config is None:  # --list-metrics
        from neuron_node_metrics.catalogue import markdown_table

        print(markdown_table())
        return 0
    logs.configure("neuron-node-metrics", config.log_level)

    from neuron_node_metrics.app import Exporter

    return lifecycle.run(lambda stop: Exporter(config, stop).run())


if __name__ == "__main__":
    sys.exit(main())
