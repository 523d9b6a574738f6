"""`neuron-remediator` entry point."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from neuron_common import lifecycle, logs
from neuron_remediation import config as config_mod


def main(argv: Sequence[str] | None = None) -> int:
    config = config_mod.parse(argv)
    logs.configure("neuron-remediator", config.log_level)
    from neuron_common.kube import api_at_start

    api = api_at_start("neuron-remediator", config.kubeconfig, config.api_timeout)  # no credentials: a clear error
    from neuron_remediation.app import Remediator

    return lifecycle.run(lambda stop: Remediator(config, stop, api).run())


if __name__ == "__main__":
    sys.exit(main())
