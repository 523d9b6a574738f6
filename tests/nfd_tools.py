"""node-feature-discovery as tests/nfd/build-nfd.sh builds it (from the pinned Go module, with the
host root linked to the working directory): one build-and-run for the offline tests and the e2e tests.

A worker started in a simulated node's root (neuron-sim) reads that node's sys/bus/pci/devices as
the host's PCI functions.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

BUILD_NFD = Path(__file__).resolve().parent / "nfd" / "build-nfd.sh"
# The worker builds an API client even with -no-publish; this one names an address nothing listens on,
# and the worker never dials it.
OFFLINE_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


@functools.cache
def nfd_bin() -> Path:
    """The directory holding nfd-master and nfd-worker (built on first use, cached across clones)."""
    result = subprocess.run([str(BUILD_NFD)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise AssertionError(f"{BUILD_NFD} failed (make setup builds node-feature-discovery):\n{result.stderr}")
    return Path(result.stdout.strip().splitlines()[-1])


def worker_env(node: str, namespace: str = "") -> dict[str, str]:
    """The worker names its NodeFeature after NODE_NAME, in KUBERNETES_NAMESPACE (else its pod's)."""
    env = dict(os.environ, NODE_NAME=node)
    if namespace:
        env["KUBERNETES_NAMESPACE"] = namespace
    return env


def run_worker_offline(root: Path, config: dict[str, Any], work: Path) -> dict[str, str]:
    """One discovery by the real nfd-worker over the node under `root` (its host root), publishing
    nothing: its PCI features only, then the labels of `config`'s sources. Returns those labels."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "offline.kubeconfig").write_text(OFFLINE_KUBECONFIG)
    # JSON, as YAML 1.1 readers take an unquoted 0880 (PyYAML's dump of the string) for a number
    (work / "nfd-worker.conf").write_text(json.dumps(config))
    result = subprocess.run(
        [str(nfd_bin() / "nfd-worker"), "-oneshot", "-no-publish", "-v=1",
         f"-kubeconfig={work / 'offline.kubeconfig'}", f"-config={work / 'nfd-worker.conf'}",
         "-feature-sources=pci", "-label-sources=custom,pci"],
        cwd=root, env=worker_env("offline-node"), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise AssertionError(f"nfd-worker failed ({result.returncode}):\n{result.stderr}")
    return discovered_labels(result.stderr)


def discovered_labels(worker_log: str) -> dict[str, str]:
    """The labels of the worker's last `feature discovery completed` line (logged at -v=1 and above):
    klog prints them as a YAML block between `labels=<` and ` >`."""
    lines = worker_log.splitlines()
    starts = [i for i, line in enumerate(lines) if '"feature discovery completed" labels=<' in line]
    if not starts:
        raise AssertionError(f"the worker logged no labels:\n{worker_log}")
    block = []
    for line in lines[starts[-1] + 1 :]:
        if line == " >":
            break
        block.append(line.removeprefix("\t"))
    labels: dict[str, Any] = yaml.safe_load("\n".join(block)) or {}
    return {str(k): str(v) for k, v in labels.items()}
