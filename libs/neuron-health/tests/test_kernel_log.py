"""Following a syslog text file of kernel lines (neuron_health.kernel_log, format "syslog"): look-back
bounded by this boot, garbage counted, rotation by rename and by copytruncate without a line lost or
read twice. Real files in a temporary directory; rotation is done the way logrotate does it."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from polling import until_async
from skips import require

from neuron_driver.kmsg import KmsgRecord, format_record
from neuron_health import kernel_log
from neuron_health.kernel_log import KmsgFollower, Malformed

BOOT_AGO = 3600.0  # this test's boot began an hour ago


def stamp(ago: float) -> str:
    return dt.datetime.fromtimestamp(time.time() - ago, dt.UTC).isoformat()


def line(text: str, ago: float = 0.0, printk: float | None = None) -> str:
    pk = f"[{printk:12.6f}] " if printk is not None else ""
    return f"{stamp(ago)} ip-10-0-0-1 kernel: {pk}{text}\n"


@pytest.fixture(autouse=True)
def boot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_log, "boot_wall_time", lambda: time.time() - BOOT_AGO)


class Reader:
    def __init__(self, path: Path, lookback: float | None, format: str) -> None:
        self.path = path
        self.items: list[KmsgRecord | Malformed] = []
        self.stop = asyncio.Event()
        self.follower = KmsgFollower(str(path), lookback=lookback, poll_interval=0.02, format=format)
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for item in self.follower.follow(self.stop):
            self.items.append(item)

    @property
    def messages(self) -> list[str]:
        return [i.message for i in self.items if isinstance(i, KmsgRecord)]

    async def until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        await until_async(predicate, f"the follower's records; read {self.items}", timeout, 0.02)

    async def read_all(self, path: Path | None = None, upto: int | None = None) -> None:
        """Until the follower has read `path` (its own, by default) to its end, or to `upto`: the
        positive marker after which what it did not yield it never will. Its records are handled in
        the step that reads their bytes, so a read position there means they are in `items`."""
        path = path or self.path
        await until_async(
            lambda: (path.stat().st_size if upto is None else upto) in read_positions(path),
            f"{path} read to {'its end' if upto is None else upto}",
            5.0,
            0.01,
        )

    async def pause(self) -> None:
        """A few polls, for the follower to meet a state the test then changes (a file renamed, gone):
        no assertion of absence follows it, only of what the next state brings."""
        await asyncio.sleep(0.2)


def read_positions(path: Path) -> set[int]:
    """Where this process's files open for reading on `path` are, as the kernel keeps them
    (/proc/self/fdinfo): the follower's read position, without asking the follower."""
    target = path.stat()
    positions = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            st = os.stat(f"/proc/self/fd/{fd}")
            if (st.st_dev, st.st_ino) != (target.st_dev, target.st_ino):
                continue
            info = dict(row.split(":", 1) for row in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines()[:3])
            if int(info["flags"].strip(), 8) & os.O_ACCMODE == os.O_RDONLY:
                positions.add(int(info["pos"]))
    return positions


@contextlib.asynccontextmanager
async def reading(path: Path, lookback: float | None = 0.0, format: str = "syslog") -> AsyncIterator[Reader]:
    reader = Reader(path, lookback, format)
    await reader.read_all()  # the file is open and read to its end (without look-back, seeked there)
    try:
        yield reader
    finally:
        reader.stop.set()
        await asyncio.wait_for(reader.task, 5)


def empty(path: Path) -> Path:
    path.write_text("")
    return path


def append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


async def test_look_back_is_bounded_by_the_window_and_by_this_boot(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(
        line("the boot before's error", ago=BOOT_AGO + 600, printk=3000.0)
        + line("this boot, long ago", ago=BOOT_AGO - 10, printk=10.0)
        + f"{stamp(30)} ip-10-0-0-1 systemd[1]: Started something.\n"
        + "garbage that is no syslog line\n"
        + line("this boot, recent", ago=20, printk=3580.0)
    )
    async with reading(log, lookback=60) as r:
        await r.until(lambda: len(r.items) == 2)
        await r.read_all()
        assert r.messages == ["this boot, recent"]
        [bad] = [i for i in r.items if isinstance(i, Malformed)]
        assert "garbage" in bad.text
    # the device plugin's whole-log reading: this boot's lines only
    async with reading(log, lookback=None) as r:
        await r.until(lambda: len(r.messages) == 2)
        await r.read_all()
        assert r.messages == ["this boot, long ago", "this boot, recent"]


async def test_follows_from_the_end_and_joins_a_line_written_in_pieces(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(line("before we started", ago=1))
    async with reading(log) as r:
        whole = line("NEURON_HW_ERR=DMA_ERROR nd-id=2 nc-id=0")
        append(log, whole[:25])
        await r.read_all()
        assert r.items == []
        append(log, whole[25:])
        await r.until(lambda: r.messages == ["NEURON_HW_ERR=DMA_ERROR nd-id=2 nc-id=0"])


async def test_a_line_stamped_earlier_than_the_one_before_is_numbered_after_it(tmp_path: Path) -> None:
    """Its printk time earlier (two CPUs' clocks), or its wall stamp (the clock stepped back on a host
    whose lines have no printk time): a reader skips a number at or below the last it handled."""
    log = empty(tmp_path / "kern.log")
    async with reading(log) as r:
        append(log, line("first", printk=100.000200) + line("second", printk=100.000100))
        append(log, line("third", ago=5) + line("fourth", ago=65))
        await r.until(lambda: len(r.messages) == 4)
        seqs = [i.seq for i in r.items if isinstance(i, KmsgRecord)]
        assert r.messages == ["first", "second", "third", "fourth"]
        assert seqs == sorted(set(seqs))


async def test_a_character_cut_in_two_by_the_writer_or_a_read_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = empty(tmp_path / "kern.log")
    async with reading(log) as r:
        whole = line("NEURON_HW_ERR=DMA_ERROR nd-id=2 nc-id=0 café").encode()
        cut = whole.index("é".encode()) + 1
        with log.open("ab") as f:
            f.write(whole[:cut])
        await r.read_all(upto=cut - 1)  # up to the cut character, which it leaves for the next read
        with log.open("ab") as f:
            f.write(whole[cut:])
        await r.until(lambda: r.messages == ["NEURON_HW_ERR=DMA_ERROR nd-id=2 nc-id=0 café"])
    monkeypatch.setattr(kernel_log, "_READ_CHUNK", 5)  # reads that end inside characters (a read holds one)
    append(log, line("€ ü 𝄞 ok"))
    async with reading(log, lookback=None) as r:
        await r.until(lambda: r.messages[-1:] == ["€ ü 𝄞 ok"])


@pytest.mark.parametrize(
    ("data", "whole"),
    [(b"", 0), (b"ab", 2), ("é".encode(), 2), ("é".encode()[:1], 0), (b"x" + "€".encode()[:2], 1),
     ("𝄞".encode()[:3], 0), (b"\x80\x80\x80\x80", 4), (b"\xff", 1)],
)  # fmt: skip
def test_whole_characters(data: bytes, whole: int) -> None:
    assert kernel_log._whole_characters(data) == whole


async def test_lines_are_numbered_in_order_through_the_boot(tmp_path: Path) -> None:
    log = empty(tmp_path / "kern.log")
    async with reading(log) as r:
        same = dt.datetime.fromtimestamp(int(time.time()) - 1, dt.UTC).isoformat()
        append(log, "".join(f"{same} ip kernel: line {n}\n" for n in range(5)) + line("later", printk=BOOT_AGO))
        await r.until(lambda: len(r.messages) == 6)
        seqs = [i.seq for i in r.items if isinstance(i, KmsgRecord)]
        assert seqs == sorted(seqs)
        assert len(set(seqs)) == 6


async def test_rotation_by_rename_loses_and_repeats_nothing(tmp_path: Path) -> None:
    log = empty(tmp_path / "messages")
    async with reading(log) as r:
        append(log, line("one"))
        await r.until(lambda: r.messages == ["one"])
        # logrotate renames the file and creates the new one (`create`); the daemon writes on to the
        # renamed file until postrotate tells it to reopen
        with log.open("a") as daemon:
            os.rename(log, tmp_path / "messages.1")
            daemon.write(line("two, to the renamed file"))
            daemon.flush()
            await r.read_all(tmp_path / "messages.1")  # "two" read before the new file appears
            log.touch()
            await r.pause()
            daemon.write(line("three, to the renamed file after the new one was created"))
        append(log, line("four, to the new file"))
        append(log, line("five"))
        await r.until(lambda: len(r.messages) >= 5)
        await r.read_all()
        assert r.messages == [
            "one",
            "two, to the renamed file",
            "three, to the renamed file after the new one was created",
            "four, to the new file",
            "five",
        ]


async def test_copytruncate_is_read_again_from_the_start(tmp_path: Path) -> None:
    log = empty(tmp_path / "kern.log")
    async with reading(log) as r:
        append(log, line("one") + line("two"))
        await r.until(lambda: len(r.messages) == 2)
        shutil.copyfile(log, tmp_path / "kern.log.1")
        os.truncate(log, 0)
        await r.read_all()  # the truncation seen: read again from 0
        append(log, line("three"))
        await r.until(lambda: len(r.messages) >= 3)
        await r.read_all()
        assert r.messages == ["one", "two", "three"]


async def test_copytruncate_then_more_than_was_read_before_the_next_look(tmp_path: Path) -> None:
    log = empty(tmp_path / "kern.log")
    async with reading(log) as r:
        append(log, line("one"))
        await r.until(lambda: r.messages == ["one"])
        # no await between: the follower cannot look while the file is short
        shutil.copyfile(log, tmp_path / "kern.log.1")
        os.truncate(log, 0)
        append(log, line("two, a line longer than the first one was") + line("three"))
        await r.until(lambda: len(r.messages) >= 3)
        await r.read_all()
        assert r.messages == ["one", "two, a line longer than the first one was", "three"]
        assert not [i for i in r.items if isinstance(i, Malformed)]


async def test_a_file_that_appears_later_is_read_from_its_start(tmp_path: Path) -> None:
    log = empty(tmp_path / "kern.log")
    async with reading(log) as r:
        os.unlink(log)
        await r.pause()
        log.write_text(line("first line of the new file"))
        await r.until(lambda: r.messages == ["first line of the new file"])


async def test_the_kmsg_format_of_a_file_is_unchanged(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    usec = kernel_log.boot_time_usec()
    kmsg.write_text(format_record(3, 1, usec, "old") + "not a record\n")
    async with reading(kmsg, lookback=None, format="kmsg") as r:
        append(kmsg, format_record(3, 2, usec + 1, "new"))
        await r.until(lambda: len(r.items) == 3)
        assert [i.message if isinstance(i, KmsgRecord) else "malformed" for i in r.items] == ["old", "malformed", "new"]


async def test_a_character_device_is_refused_as_syslog() -> None:
    with pytest.raises(OSError, match="regular file"):
        async for _ in KmsgFollower("/dev/null", format="syslog").follow(asyncio.Event()):
            pass


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="kmsg, syslog"):
        KmsgFollower("/dev/null", format="journal")


def test_the_hosts_zone_is_read_from_its_localtime(tmp_path: Path) -> None:
    assert kernel_log.host_timezone(tmp_path) is None  # none there: this process's zone
    zone = Path("/usr/share/zoneinfo/Asia/Tokyo")
    require([] if zone.exists() else [f"{zone} (Debian's tzdata)"], "make setup")
    (tmp_path / "etc").mkdir()
    shutil.copyfile(zone, tmp_path / "etc" / "localtime")
    tz = kernel_log.host_timezone(tmp_path)
    assert tz is not None
    assert dt.datetime(2026, 11, 26, tzinfo=tz).utcoffset() == dt.timedelta(hours=9)
