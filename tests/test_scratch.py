"""tests/scratch.py puts temporaries on tmpfs only when it has room for a whole run."""

from __future__ import annotations

import os
from pathlib import Path

import scratch


def _stats(bavail_bytes: int, favail: int, files: int = 3_000_000) -> os.statvfs_result:
    # statvfs_result fields: bsize frsize blocks bfree bavail files ffree favail flag namemax
    return os.statvfs_result((4096, 4096, 0, 0, bavail_bytes // 4096, files, favail, favail, 0, 255))


def test_a_directory_with_bytes_and_inodes_to_spare_is_roomy(tmp_path: Path) -> None:
    assert scratch.roomy(str(tmp_path), lambda _: _stats(8 << 30, 2_000_000))


def test_too_few_free_inodes_is_not_roomy_however_many_bytes(tmp_path: Path) -> None:
    assert not scratch.roomy(str(tmp_path), lambda _: _stats(20 << 30, scratch.MIN_FREE_INODES - 1))


def test_a_container_sized_shm_is_not_roomy(tmp_path: Path) -> None:
    assert not scratch.roomy(str(tmp_path), lambda _: _stats(64 << 20, 2_000_000))


def test_a_file_system_without_an_inode_limit_counts_bytes_only(tmp_path: Path) -> None:
    assert scratch.roomy(str(tmp_path), lambda _: _stats(8 << 30, 0, files=0))


def test_a_missing_or_unreadable_directory_is_not_roomy(tmp_path: Path) -> None:
    assert not scratch.roomy(str(tmp_path / "absent"))

    def refuse(_: str) -> os.statvfs_result:
        raise PermissionError("statvfs refused")

    assert not scratch.roomy(str(tmp_path), refuse)
