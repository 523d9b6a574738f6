"""`neuron-scheduler-extender` entry point."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from neuron_common import lifecycle, logs
from neuron_scheduler_extender import config as config_mod


def main(argv: Sequence[str] | None = None) -> int:
    config = config_mod.parse(argv)
    logs.configure("neuron-scheduler-extender", config.log_level)

    from neuron_scheduler_extender.app import Extender

    return lifecycle.run(lambda stop: Extender(config, stop).run())


if __name__ == "__main__":
    sys.exit(main())
