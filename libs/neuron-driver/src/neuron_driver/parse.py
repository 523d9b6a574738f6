"""Pure parsers for the driver's attribute formats. No I/O, so they are tested exhaustively.

Each raises `ValueError` with a message that quotes what it saw; callers turn that into a
`ScanIssue` with the file's path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_INT_RE = re.compile(r"^[+-]?\d+$", re.ASCII)  # \d alone also takes other scripts' digits ("٣")
_SERIAL_RE = re.compile(r"^[0-9a-f]{16}$")


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "...")


def decimal(text: str) -> int | None:
    """`text` as a number of plain ASCII digits, else None: str.isdigit() also admits "²", which
    int() refuses, and int() reads other scripts' digits ("٣" is 3)."""
    return int(text) if text.isascii() and text.isdigit() else None


def parse_int(text: str) -> int:
    """A driver integer attribute: decimal, optional trailing newline (core_count has none)."""
    stripped = text.strip()
    if not _INT_RE.match(stripped):
        raise ValueError(f"expected an integer, found {_shown(text)}")
    return int(stripped)


def parse_core_count(text: str) -> int:
    value = parse_int(text)
    if value <= 0:
        raise ValueError(f"core_count must be positive, found {_shown(text)}")
    return value


def parse_connected_devices(text: str) -> tuple[int, ...]:
    """`connected_devices` is a comma-and-space list, e.g. ``"1, 3, 4\\n"``; empty means none."""
    stripped = text.strip()
    if not stripped:
        return ()
    result: list[int] = []
    for part in stripped.split(","):
        index = decimal(part.strip())
        if index is None:
            raise ValueError(f"expected a list of device indices like '1, 3, 4', found {_shown(text)}")
        result.append(index)
    return tuple(result)


def parse_lnc(text: str) -> int:
    try:
        value = parse_int(text)
    except ValueError:
        value = 0
    if value not in (1, 2):
        raise ValueError(f"the logical NeuronCore config must be 1 or 2, found {_shown(text)}")
    return value


def parse_serial_number(text: str) -> str | None:
    """`%016llx`; the driver writes an empty value when it could not read the serial."""
    stripped = text.strip()
    if not stripped:
        return None
    if not _SERIAL_RE.match(stripped):
        raise ValueError(f"expected 16 hex digits, found {_shown(text)}")
    return stripped


@dataclass(frozen=True, slots=True)
class PowerReading:
    """`stats/power/utilization`: `<status>,<timestamp>,<min_power>,<max_power>,<avg_power>`.

    The power figures are the driver's utilisation figures for the last sampling window,
    in percent of the device's maximum power; status 0 means the sample is valid.
    """

    status: int
    timestamp: int
    min_power: int
    max_power: int
    avg_power: int

    @property
    def valid(self) -> bool:
        return self.status == 0


def parse_power_utilization(text: str) -> PowerReading:
    parts = [p.strip() for p in text.strip().split(",")]
    if len(parts) != 5 or not all(_INT_RE.match(p) for p in parts):
        raise ValueError(f"expected '<status>,<timestamp>,<min>,<max>,<avg>', found {_shown(text)}")
    status, timestamp, lo, hi, avg = (int(p) for p in parts)
    return PowerReading(status, timestamp, lo, hi, avg)


# --- UltraServer class attributes (neuron_model.ultraserver; aws-neuron-driver v3/neuron_pelect.c) ---
BUSY = "busy"  # the driver's election is still running
_SERVER_ID_RE = re.compile(r"^[0-9a-f]{16}$")


def parse_ultraserver_modes(text: str) -> tuple[int, ...] | str:
    """`ultraserver_mode`: the supported modes joined by commas (`1,2,3,4`), `busy`, or empty (none)."""
    stripped = text.strip()
    if stripped == BUSY:
        return BUSY
    if not stripped:
        return ()
    modes = []
    for part in stripped.split(","):
        mode = decimal(part)
        if mode is None or not 1 <= mode <= 4:
            raise ValueError(f"expected UltraServer modes like '1,2,3,4', found {_shown(text)}")
        modes.append(mode)
    return tuple(modes)


def parse_ultraserver_node_id(text: str) -> int | str:
    """`node_id_N` / `node_id`: `%d`, -1 for no group of that size, or `busy`; `invalid` is an error."""
    stripped = text.strip()
    if stripped == BUSY:
        return BUSY
    value = parse_int(stripped)
    if value < -1:
        raise ValueError(f"expected a node id of -1 or more, found {_shown(text)}")
    return value


def parse_ultraserver_server_id(text: str) -> str | None:
    """`server_id_N` / `reservation_id`: 16 lowercase hex digits; all zeros (none, or none yet) is None."""
    stripped = text.strip()
    if not _SERVER_ID_RE.match(stripped):
        raise ValueError(f"expected 16 lowercase hex digits, found {_shown(text)}")
    return None if stripped == "0" * 16 else stripped
