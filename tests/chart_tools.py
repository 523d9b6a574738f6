"""Where tests/chart/build-tools.sh put the chart checks' tools (ct, kubectl-validate, OpenAPI
documents, CRDs): one build-and-read for the chart tests and the e2e tests alike; and the render
arguments both suites use for the KMM and NFD objects (checked against the CRDs offline by the
chart tests, by a server-side dry-run on the cluster by the e2e tests)."""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path

BUILD_TOOLS = Path(__file__).resolve().parent / "chart" / "build-tools.sh"


@functools.cache
def chart_tools() -> dict[str, str]:
    """The keys of the cache's paths.env (CT, CT_ETC, KUBECTL_VALIDATE, OPENAPI_NEWEST, ...)."""
    result = subprocess.run([str(BUILD_TOOLS)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise AssertionError(f"{BUILD_TOOLS} failed (make setup builds these tools):\n{result.stderr}")
    paths = Path(result.stdout.strip().splitlines()[-1]) / "paths.env"
    return dict(line.split("=", 1) for line in paths.read_text().splitlines() if "=" in line)


def sets(**values: object) -> list[str]:
    """--set-json arguments; a double underscore is a dot (`driver__image__tag`). Helm applies every --set after
    every --set-json, so arguments built here are only ever combined with more of them."""
    out: list[str] = []
    for key, value in values.items():
        out += ["--set-json", f"{key.replace('__', '.')}={json.dumps(value)}"]
    return out


NFD_API = ["--api-versions", "nfd.k8s-sigs.io/v1alpha1"]
KMM_API = ["--api-versions", "kmm.sigs.x-k8s.io/v1beta1"]
NODE_ENABLEMENT_GROUPS = ("nfd.k8s-sigs.io/", "kmm.sigs.x-k8s.io/")
DRIVER = sets(
    driver__enabled=True, driver__image__repository="neuron/neuron-driver", driver__image__tag="2.22.2.0",
    placement__mode="nfd",
)  # fmt: skip

# Every shape of KMM and NFD object the chart renders: the rule (default, and another label and ids) and the
# Module (NFD label, another NFD label or its own selector; no pull secret, the first global one or its own;
# another kernel regexp, pull policy, registry and tolerations). tests/chart also validates every combination
# of the Module's values.
NODE_ENABLEMENT_VARIANTS = {
    "rule": sets(placement__mode="nfd", placement__nodeFeatureRule__enabled=True),
    "rule-custom": sets(
        placement__mode="nfd", placement__nodeFeatureRule__enabled=True, placement__nfdLabel="example.com/neuron",
        placement__nodeFeatureRule__deviceIds=["7164"],
    ),
    "module": [*DRIVER, *sets(driver__devicePluginWaitsForModule=True)],
    "module-secret-selector": [*DRIVER, *sets(
        placement__mode="instanceType", driver__nodeSelector={"a": "b", "c": "d"}, global__imagePullSecrets=["s"],
        driver__kernelVersionRegexp="^6\\..*$", driver__image__pullPolicy="Always", driver__tolerations=[],
    )],
    "module-own-secret-label-tolerations": [*DRIVER, *sets(
        placement__nfdLabel="example.com/neuron", driver__imageRepoSecret="kmm-pull",
        global__imageRegistry="mirror.example.internal:5000",
        driver__tolerations=[{"key": "dedicated", "operator": "Equal", "value": "neuron", "effect": "NoExecute",
                              "tolerationSeconds": 60}],
    )],
}  # fmt: skip
