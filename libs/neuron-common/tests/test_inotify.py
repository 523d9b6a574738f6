from __future__ import annotations

import asyncio
from pathlib import Path

from neuron_common.inotify import DirectoryWatch


async def test_wakes_on_create_and_delete(tmp_path: Path) -> None:
    watch = DirectoryWatch(tmp_path)
    assert await watch.wait(0.05) is False  # nothing happened: a plain timeout
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, (tmp_path / "kubelet.sock").touch)
    started = loop.time()
    assert await watch.wait(5) is True
    assert loop.time() - started < 2  # woken by the event, not the timeout
    loop.call_later(0.05, (tmp_path / "kubelet.sock").unlink)
    assert await watch.wait(5) is True
    watch.close()


async def test_a_missing_directory_polls_until_it_exists(tmp_path: Path) -> None:
    watch = DirectoryWatch(tmp_path / "later")
    assert await watch.wait(0.05) is True  # no inotify possible: each poll may be a change
    (tmp_path / "later").mkdir()
    assert await watch.wait(0.05) is False  # now watched: a quiet directory times out
    watch.close()
