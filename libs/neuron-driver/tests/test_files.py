from __future__ import annotations

import os
from pathlib import Path

import pytest

from neuron_driver import files
from neuron_driver.files import replace_file


def test_the_file_is_written_whole_and_its_directory_made(tmp_path: Path) -> None:
    path = tmp_path / "state" / "checkpoint.json"
    replace_file(path, "one")
    replace_file(path, "two")
    assert path.read_text() == "two"
    assert os.listdir(path.parent) == ["checkpoint.json"]  # no dot file left behind


def test_a_failed_write_keeps_the_old_content_and_leaves_no_dot_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "checkpoint.json"
    replace_file(path, "old")

    def full_disk(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space"):
        replace_file(path, "new")
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["checkpoint.json"]


def test_a_durable_write_syncs_the_file_and_then_its_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)
    path = tmp_path / "checkpoint.json"
    replace_file(path, "claims", durable=True)
    assert len(synced) == 2
    assert Path(synced[0]).name.startswith(".checkpoint.json.")  # the content, before the rename
    assert synced[1] == str(tmp_path)  # the rename itself
    synced.clear()
    replace_file(path, "claims")
    assert synced == []  # a tmpfs file (a CDI spec) is not synced
