"""CDI specs: their shape, atomic writes, idempotent removal."""

from __future__ import annotations

import json
from pathlib import Path

from neuron_driver import cdi


def test_edits_name_each_device_node_once_under_the_host_root(tmp_path: Path) -> None:
    edits = cdi.container_edits([3, 1, 3], tmp_path, {"B": "2", "A": "1"})
    assert edits == {
        "deviceNodes": [
            {"path": "/dev/neuron1", "hostPath": str(tmp_path / "dev/neuron1"), "permissions": "rw"},
            {"path": "/dev/neuron3", "hostPath": str(tmp_path / "dev/neuron3"), "permissions": "rw"},
        ],
        "env": ["A=1", "B=2"],
    }
    assert "env" not in cdi.container_edits([0], tmp_path)


def test_write_replaces_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    spec = cdi.spec("example.com/thing", {"a": cdi.container_edits([0], Path("/"))})
    name = cdi.spec_file_name("example.com/thing", "uid-1")
    assert name == "example.com_thing-uid-1.json"
    path = cdi.write_spec(tmp_path / "cdi", name, spec)
    cdi.write_spec(tmp_path / "cdi", name, {**spec, "devices": []})
    assert json.loads(path.read_text())["devices"] == []
    assert [p.name for p in (tmp_path / "cdi").iterdir()] == [name]
    assert cdi.qualified_name("example.com/thing", "a") == "example.com/thing=a"


def test_remove_is_idempotent(tmp_path: Path) -> None:
    cdi.write_spec(tmp_path, "x.json", cdi.spec("example.com/thing", {}))
    assert cdi.remove_spec(tmp_path, "x.json") is True
    assert cdi.remove_spec(tmp_path, "x.json") is False
