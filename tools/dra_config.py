"""Writes charts/neuron-helm-chart/files/dra-opaque-config.yaml (`make dra-config`): what the chart's
admission policy refuses a DRA claim's, template's or DeviceClass's opaque config for, taken from the
driver's own parser (`neuron_dra_driver.parameters.admission_facts`), whose logical-core values come from
the node model's families. The policy's CEL (templates/dra-driver/config-policy.yaml) is rendered from it;
tests/chart/test_dra_config_policy.py keeps the committed file equal to this script's output.

    dra_config.py            write the file
    dra_config.py --check    exit 1 when it is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from neuron_dra_driver.parameters import admission_facts

OUT = Path(__file__).resolve().parent.parent / "charts" / "neuron-helm-chart" / "files" / "dra-opaque-config.yaml"
HEADER = """\
# The DRA driver's opaque configs as the chart's admission policy checks them: made by `make dra-config`
# (tools/dra_config.py) from neuron_dra_driver.parameters and the node model; do not edit by hand (a test
# keeps them equal). Logical-core values: those some Neuron family accepts; which one a node accepts is
# checked when the claim is prepared there.
"""


def text() -> str:
    return HEADER + yaml.safe_dump(admission_facts(), sort_keys=False)


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        if not OUT.exists() or OUT.read_text() != text():
            print(f"{OUT} is stale: run `make dra-config`", file=sys.stderr)
            return 1
        return 0
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    OUT.write_text(text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
