"""`neuron-problem-detector` entry point."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from neuron_common import lifecycle, logs
from neuron_problem_detector import config as config_mod
from neuron_problem_detector.config import API_TIMEOUT


def main(argv: Sequence[str] | None = None) -> int:
    config = config_mod.parse(argv)
    logs.configure("neuron-problem-detector", config.log_level)
    from neuron_common.kube import api_at_start
    from neuron_problem_detector.rules import RulesError, load

    try:
        load(config.rules)  # a bad rules file is a clear error at start, not a crash later
    except RulesError as exc:
        print(f"neuron-problem-detector: error: {exc}", file=sys.stderr)
        return 2
    api = api_at_start("neuron-problem-detector", config.kubeconfig, API_TIMEOUT)  # so is no credentials
    from neuron_problem_detector.app import Detector

    return lifecycle.run(lambda stop: Detector(config, stop, api).run())


if __name__ == "__main__":
    sys.exit(main())
