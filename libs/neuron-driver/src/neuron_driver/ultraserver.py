"""The node's UltraServer identity, read from the driver's class attributes
(`sys/class/neuron_device/`): trn2u's `ultraserver_mode`, `node_id_4`, `server_id_4`, `node_id_2`,
`server_id_2`; Trainium3's `reservation_id`, `node_id`, `node_cnt`. While the driver's election runs
they read `busy` (or an all-zero server id): that is PENDING, to be asked again, never a guess.
"""

from __future__ import annotations

from pathlib import Path

from neuron_driver import layout
from neuron_driver.attrs import read_text
from neuron_driver.errors import SysfsError
from neuron_driver.parse import (
    parse_int,
    parse_ultraserver_modes,
    parse_ultraserver_node_id,
    parse_ultraserver_server_id,
)
from neuron_model.ultraserver import GROUP_SIZES, Mode, State, UltraServerIdentity, UltraServerReading

MODES_ATTR = "ultraserver_mode"
RESERVATION_ATTR = "reservation_id"  # Trainium3: the reservation's id stands for the server id
NODE_COUNT_ATTR = "node_cnt"


class _Pending(Exception):
    pass


def _read(path: Path) -> str:
    try:
        return read_text(path)
    except SysfsError as exc:
        raise ValueError(exc.issue.message) from None


def read_ultraserver(root: str | Path) -> UltraServerReading:
    directory = layout.HostLayout(Path(root)).class_dir
    modes_path = directory / MODES_ATTR
    if not modes_path.exists():
        return UltraServerReading(State.NONE, reason=f"{modes_path}: absent (no UltraServer support)")
    where = modes_path
    try:
        modes = parse_ultraserver_modes(_read(modes_path))
        if isinstance(modes, str):  # BUSY
            raise _Pending(f"{modes_path}: busy (the driver's UltraServer election is running)")
        if not modes:
            return UltraServerReading(State.NONE, reason=f"{modes_path}: empty (not an UltraServer node)")
        supported = tuple(Mode(m) for m in modes)
        groups: list[tuple[Path, Path, Path | None]]
        if (directory / RESERVATION_ATTR).exists():
            groups = [(directory / "node_id", directory / RESERVATION_ATTR, directory / NODE_COUNT_ATTR)]
        else:
            groups = [(directory / f"node_id_{n}", directory / f"server_id_{n}", None) for n in GROUP_SIZES]
        server_ids: dict[int, str] = {}
        node_ids: dict[int, int] = {}
        for index, (node_path, server_path, count_path) in enumerate(groups):
            if not node_path.exists():
                continue
            where = node_path
            node = parse_ultraserver_node_id(_read(node_path))
            if isinstance(node, str):  # BUSY
                raise _Pending(f"{node_path}: busy (the driver's UltraServer election is running)")
            if node == -1:
                continue  # in no group of this size
            where = count_path if count_path is not None else server_path
            size = parse_int(_read(count_path)) if count_path is not None else GROUP_SIZES[index]
            if size < 1:
                continue  # node_cnt -1: not a partitioned platform
            if node >= size:
                where = node_path
                raise ValueError(f"node id {node} does not fit a group of {size}")
            where = server_path
            server = parse_ultraserver_server_id(_read(server_path))
            if server is None:
                raise _Pending(f"{server_path}: no server id yet for node id {node}")
            server_ids[size], node_ids[size] = server, node
    except _Pending as pending:
        return UltraServerReading(State.PENDING, reason=str(pending))
    except ValueError as exc:
        return UltraServerReading(State.INVALID, reason=f"{where}: {exc}")
    return UltraServerReading(State.IDENTIFIED, UltraServerIdentity(supported, server_ids, node_ids))
