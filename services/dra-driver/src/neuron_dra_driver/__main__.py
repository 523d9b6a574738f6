"""`neuron-dra-driver` entry point."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from neuron_common import lifecycle, logs
from neuron_dra_driver import config as config_mod


def main(argv: Sequence[str] | None = None) -> int:
    config = config_mod.parse(argv)
    logs.configure("neuron-dra-driver", config.log_level)
    from neuron_common.kube import Api

    try:
        api = Api.from_kubeconfig(config.kubeconfig, config.api_timeout)
    except Exception as exc:  # no credentials is a clear error at start, not a crash later
        print(f"neuron-dra-driver: error: cannot load API server credentials: {exc}", file=sys.stderr)
        return 2

    from neuron_dra_driver.app import DraDriver

    return lifecycle.run(lambda stop: DraDriver(config, stop, api).run())


if __name__ == "__main__":
    sys.exit(main())
