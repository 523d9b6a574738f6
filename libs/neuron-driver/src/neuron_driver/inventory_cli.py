"""`neuron-inventory`: print what `neuron_driver` discovers on a node (real or simulated)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from neuron_driver import driver_layout
from neuron_driver.inventory import NodeInventory, scan


def _ranges(values: tuple[int, ...] | list[int]) -> str:
    if not values:
        return "-"
    parts: list[str] = []
    start = prev = values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(parts)


def _ultraserver(inv: NodeInventory) -> str:
    reading = inv.ultraserver
    if reading.identity is None:
        return f"{reading.state}" + (f" ({reading.reason})" if reading.reason and reading.state != "none" else "")
    modes = ",".join(m.name for m in reading.identity.modes)
    groups = ", ".join(
        f"{size}-node {server} as node {reading.identity.node_ids[size]}"
        for size, server in sorted(reading.identity.server_ids.items(), reverse=True)
    )
    return f"modes {modes}; {groups or 'in no group'}"


def render_text(inv: NodeInventory) -> str:
    lines = [
        f"instance type:     {inv.instance_type_name or 'unknown'} ({inv.instance_type_source})",
        f"logical NC config: {inv.lnc.value} ({inv.lnc.source})",
        f"devices:           {len(inv.devices)}",
        f"logical cores:     {len(inv.cores)} ({inv.logical_cores_per_device} per device)",
        f"topology:          {inv.instance_type.topology if inv.instance_type else 'unknown'} "
        f"(from {inv.topology_source})",
        f"UltraServer:       {_ultraserver(inv)}",
        "",
        f"{'DEVICE':<10}{'CORES':<12}{'NUMA':<6}{'SERIAL':<18}CONNECTED",
    ]
    for d in inv.devices:
        lines.append(
            f"{'neuron' + str(d.index):<10}{_ranges(d.logical_cores):<12}"
            f"{'-' if d.numa_node is None else d.numa_node!s:<6}"
            f"{d.serial or '-':<18}{_ranges(list(inv.adjacency.get(d.index, ())))}"
        )
    if inv.issues:
        lines.append("")
        lines.append("issues:")
        lines.extend(f"  {i}" for i in inv.issues)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="neuron-inventory", description=__doc__)
    p.add_argument("--root", default="/", help="host root holding sys/, dev/ and opt/aws/ (default /)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--check",
        action="store_true",
        help="compare what the driver exposes with what the stack reads for its version "
        "(sys/module/neuron/version, else the tree itself): name every path expected and not found, per "
        "device; exit 1 if any is missing",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # issues are part of the output already
    inv = scan(args.root)
    if args.check:
        report = driver_layout.check_layout(args.root, inv)
        if args.json:
            print(json.dumps(report.to_dict(), indent=2))
        else:
            print("\n".join(report.lines()))
        return 0 if inv.devices and report.ok else 1
    print(json.dumps(inv.to_dict(), indent=2) if args.json else render_text(inv))
    return 0 if inv.devices else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
