"""A node reporting another name of a table entry's hardware (a driver or chart name) is that entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from neuron_driver.inventory import InstanceTypeSource, scan
from neuron_sim import node as sim


@pytest.mark.parametrize(
    ("name", "entry"), [("trn3sn-es.3xlarge", "trn3pd98.3xlarge"), ("trn3en.24xlarge", "trn3e.24xlarge")]
)
def test_an_alias_from_dmi_is_its_entry_under_its_own_name(tmp_path: Path, name: str, entry: str) -> None:
    sim.create(tmp_path, name)
    inv = scan(tmp_path, env={})
    assert inv.instance_type is not None
    assert inv.instance_type.name == entry
    assert (inv.instance_type_name, inv.instance_type_source) == (name, InstanceTypeSource.DMI)
    assert len(inv.devices) == inv.instance_type.devices
    assert not inv.issues
