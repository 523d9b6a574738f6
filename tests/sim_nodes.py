"""Simulated nodes that tests only read, written once per run and shared by every test module.

A trn2 node is ~12,000 files: writing one and deleting it at the end of the run takes about a
second. Tests that only scan a node of an instance type and LNC setting (the round trip, the
device plugin's report, the DRA driver's slices and claims) share one here instead of writing their
own. A test that changes a node's files must write its own (`neuron_sim.node.create`).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path

from neuron_driver.inventory import NodeInventory, scan
from neuron_sim import node as sim


@cache
def _base() -> Path:
    path = Path(tempfile.mkdtemp(prefix="sim-nodes-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def node_root(instance_type: str, lnc: int | None = None) -> Path:
    """The root of a fresh simulated node of the type and LNC setting (None: no lnc_config file).
    Shared: read it, never change it."""
    return _node_root(instance_type, lnc)


def inventory(instance_type: str, lnc: int | None = None) -> NodeInventory:
    """`scan(node_root(...), env={})`, also once a run."""
    return _inventory(instance_type, lnc)


# cached with every argument given: functools.cache keys f(a) and f(a, None) apart
@cache
def _node_root(instance_type: str, lnc: int | None) -> Path:
    root = _base() / f"{instance_type}-lnc{lnc}"
    sim.create(root, instance_type, lnc)
    return root


@cache
def _inventory(instance_type: str, lnc: int | None) -> NodeInventory:
    return scan(_node_root(instance_type, lnc), env={})
