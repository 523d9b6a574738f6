"""`neuron-sim`: create a simulated Neuron node and inject faults into it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from neuron_driver import layout
from neuron_driver.kmsg import KERN_ERR
from neuron_health import faults
from neuron_model.instance_types import ALL_NAMES, INSTANCE_TYPES, UnknownInstanceTypeError
from neuron_sim import node as sim


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="neuron-sim",
        description="A simulated Neuron node (driver sysfs, /dev/neuronN, kernel log) under a root directory, "
        "for tests, demos and clusters without Neuron hardware.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("create", help="write a simulated node for an instance type")
    c.add_argument(
        "--instance-type",
        required=True,
        choices=sorted(ALL_NAMES),
        metavar="TYPE",
        help="one of: " + ", ".join(ALL_NAMES),
    )
    c.add_argument("--root", required=True, type=Path, help="directory to write the node under")
    c.add_argument(
        "--lnc",
        type=int,
        choices=(1, 2),
        help="write opt/aws/neuron/logical_nc_config; without it the family default applies (2 on trn2)",
    )
    c.add_argument(
        "--char-devices",
        action="store_true",
        help=f"make dev/neuronN real character devices (major {sim.SIM_CHAR_MAJOR}, minor N; needs root)",
    )
    c.add_argument("--force", action="store_true", help="replace a simulated node already under --root")
    c.add_argument(
        "--driver-version",
        help="write sys/module/neuron/version (the loaded driver's MODULE_VERSION, e.g. 2.30.2.0) and that "
        "driver generation's sysfs tree: before 2.28; 2.28 (stats/hardware/health_status/); 2.30.2 "
        "(unhealthy_components and healthcheck_heartbeat on trn2/trn3, the corrected ECC counts). 2.31 moved "
        "nodes to paths no source here names, so it is refused. Without it: no version, the tree before 2.28",
    )

    u = sub.add_parser(
        "create-ultraserver",
        help="write every node of one UltraServer under <root>/node-0 .. node-<N-1>, with the driver's "
        "UltraServer identity (server ids, node ids, supported modes) as after its election",
    )
    u.add_argument(
        "--instance-type",
        default="trn2u.48xlarge",
        help="an UltraServer instance type (trn2u.48xlarge; trn3.48xlarge: a Trainium3 PDS reservation of 4)",
    )
    u.add_argument("--root", required=True, type=Path, help="directory to write the nodes under")
    u.add_argument("--nodes", type=int, default=4, choices=(2, 4), help="nodes in the UltraServer")
    u.add_argument("--server-id", help="the UltraServer's id, 16 lowercase hex digits (default: random)")
    u.add_argument("--force", action="store_true", help="replace simulated nodes already there")
    u.add_argument(
        "--char-devices",
        action="store_true",
        help="make each node's dev/neuronN real character devices (needs root), as create does",
    )

    n = sub.add_parser(
        "create-non-neuron",
        help="write a node without Neuron devices (an EC2 instance's PCI functions only), to check nothing "
        "takes it for a Neuron node",
    )
    n.add_argument("--root", required=True, type=Path, help="directory to write the node under")
    n.add_argument("--instance-type", default="m5.xlarge", help="EC2 instance type in the DMI product name")
    n.add_argument("--force", action="store_true", help="replace a simulated node already under --root")

    f = sub.add_parser("faults", help="print the hardware fault table (Markdown): the kinds `inject fault` takes")
    f.add_argument("--ladder", action="store_true", help="print each fault's remediation rung instead")

    mon = sub.add_parser(
        "monitor",
        help="a stand-in for neuron-monitor: its JSON documents on stdout, one line per period, for the node "
        "under --root (or an --instance-type); figures are made up",
    )
    where = mon.add_mutually_exclusive_group(required=True)
    where.add_argument("--root", type=Path, help="a simulated node (its devices, cores and LNC)")
    where.add_argument("--instance-type", choices=sorted(INSTANCE_TYPES), metavar="TYPE")
    mon.add_argument("-c", "--config-file", type=Path, help="neuron-monitor's configuration file (its period)")
    mon.add_argument("--period", type=float, default=5.0, help="seconds between documents (neuron-monitor's 5)")
    mon.add_argument("--runtimes", type=int, default=2, help="Neuron runtimes reporting")
    mon.add_argument("--cores-per-runtime", type=int, default=2)
    mon.add_argument("--churn-every", type=int, default=0, help="every N documents a runtime exits, another starts")
    mon.add_argument("--runtimes-file", type=Path, help='reread before each document: [{"pid","tag","cores","idle"?}]')
    mon.add_argument("--malformed-every", type=int, default=0, help="every N documents, a malformed line first")
    mon.add_argument("--count", type=int, default=0, help="lines to write, then exit 0 (0: forever)")
    mon.add_argument("--exit-after", type=int, default=0, help="lines to write, then exit 1 as if crashed")
    mon.add_argument("--seed", type=int, default=0)

    drv = sub.add_parser(
        "driver",
        help="the driver's side of a simulated node, in a loop: each write of a device's reset node "
        "(sys/class/neuron_device/neuronN/reset, the driver's own path) resets that device, as the driver "
        "does; optionally the firmware's heartbeat moves on",
    )
    drv.add_argument("--root", required=True, type=Path)
    drv.add_argument("--interval", type=float, default=0.2, help="seconds between looks at the reset nodes")
    drv.add_argument(
        "--heartbeat-every",
        type=float,
        default=0.0,
        help="beat every device's healthcheck_heartbeat this often, but those stalled (inject heartbeat-stall); "
        "0: never (a heartbeat then moves only when injected)",
    )
    drv.add_argument("--count", type=int, default=0, help="passes, then exit 0 (0: forever)")

    d = sub.add_parser("destroy", help="remove the simulated node's files under --root")
    d.add_argument("--root", required=True, type=Path)

    i = sub.add_parser("inject", help="change a simulated node: counters, kernel log, devices, memory, power")
    i.add_argument("--root", required=True, type=Path)
    isub = i.add_subparsers(dest="what", required=True)

    ctr = isub.add_parser("counter", help="bump or set a core status / other_info counter or a device hardware counter")
    ctr.add_argument("--device", type=int, required=True)
    ctr.add_argument("--core", type=int, help="physical core within the device; omit for a device hardware counter")
    ctr.add_argument(
        "--name",
        required=True,
        help="status name (e.g. hw_error), other_info name, or hardware counter (e.g. mem_ecc_uncorrected)",
    )
    ctr.add_argument("--field", default="total", choices=layout.STATUS_FIELDS)
    g = ctr.add_mutually_exclusive_group()
    g.add_argument("--by", type=int, default=1, help="add this much (default 1)")
    g.add_argument("--raw", help="write this text verbatim (for malformed-value tests)")

    hw = isub.add_parser("hw-error", help="append a NEURON_HW_ERR line to the kernel log")
    hw.add_argument(
        "--kind", required=True, help="the runtime's kind: " + ", ".join(faults.KERNEL_NAMES) + " or any other"
    )
    hw.add_argument("--device", type=int, required=True)
    hw.add_argument("--core", type=int, default=0)
    hw.add_argument("--action", default="TERMINATE_INSTANCE")
    hw.add_argument("--serial", help="default: the device's simulated serial number")

    ft = isub.add_parser("fault", help="a fault of the fault table, shown through one of its sources")
    ft.add_argument(
        "--kind",
        required=True,
        choices=[f.kind for f in faults.FAULTS],
        metavar="KIND",
        help="one of: " + ", ".join(f.kind for f in faults.FAULTS),
    )
    ft.add_argument("--device", type=int, required=True)
    ft.add_argument(
        "--via",
        choices=sim.FAULT_SOURCES,
        default="kernel",
        help="a kernel line, one more on the fault's device counter or core status counter, or the firmware's "
        "verdict (unhealthy_components; the default for its faults)",
    )
    ft.add_argument("--core", type=int, default=0, help="physical core, for a kernel line or a core counter")
    ft.add_argument(
        "--transient",
        action="store_true",
        help="with --via firmware: an entry a device reset ends (without it: a defect a reset leaves)",
    )

    fw = isub.add_parser(
        "unhealthy-components",
        help="set the firmware's verdict, health_status/unhealthy_components (driver 2.30.2, trn2/trn3)",
    )
    fw.add_argument("--device", type=int, required=True)
    fw.add_argument(
        "--components",
        required=True,
        help="comma-separated failing subsystems (" + ", ".join(layout.UNHEALTHY_COMPONENTS) + "); '' clears it",
    )
    fw.add_argument(
        "--transient",
        default="",
        help="comma-separated, among --components: those a device reset ends; the others are defects it leaves",
    )
    rs = isub.add_parser(
        "reset",
        help="reset a device now, as the driver does on a write of its reset node: transient states end, "
        "defects stay, counters stay cumulative",
    )
    rs.add_argument("--device", type=int, required=True)
    st = isub.add_parser(
        "heartbeat-stall",
        help="the firmware's health checks stop: `neuron-sim driver --heartbeat-every` beats this device no more",
    )
    st.add_argument("--device", type=int, required=True)
    st.add_argument("--persistent", action="store_true", help="a stall a device reset does not end")
    hr = isub.add_parser(
        "heartbeat-resume",
        help="the firmware's health checks start again by themselves (a stall not --persistent): beaten again",
    )
    hr.add_argument("--device", type=int, required=True)
    hr.add_argument("--mended", action="store_true", help="a persistent stall too (the device replaced)")
    hb = isub.add_parser(
        "heartbeat",
        help="beat health_status/healthcheck_heartbeat once (driver 2.30.2); one never beaten again goes stale",
    )
    hb.add_argument("--device", type=int, required=True)
    hb.add_argument("--value", help="write this text instead of the next beat")
    mv = isub.add_parser(
        "move-node",
        help="rename a directory or file of a device's tree (e.g. stats/hardware to stats/hardware_v2), as a "
        "driver that moved a node shows it",
    )
    mv.add_argument("--device", type=int, required=True)
    mv.add_argument("--path", required=True, help="relative to the device's directory, e.g. stats/hardware")
    mv.add_argument("--to", required=True, help="its new path, relative to the device's directory")

    isub.add_parser("reload-driver", help="every error counter back to zero, as after reloading the driver")

    km = isub.add_parser("kmsg", help="append a kernel log record")
    km.add_argument("--message", required=True)
    km.add_argument("--priority", type=int, default=KERN_ERR)
    km.add_argument("--raw", action="store_true", help="append --message verbatim, not as a kmsg record")

    for name, text in (("vanish", "make a device disappear"), ("restore", "bring a vanished device back")):
        v = isub.add_parser(name, help=text)
        v.add_argument("--device", type=int, required=True)

    m = isub.add_parser("memory", help="set a memory usage figure (present; peak follows)")
    m.add_argument("--device", type=int, required=True)
    m.add_argument("--core", type=int, help="physical core (device_mem category); omit for device host_mem")
    m.add_argument("--category", required=True)
    m.add_argument("--bytes", type=int, required=True, dest="present")
    m.add_argument("--location", choices=("device_mem", "host_mem"), default="device_mem")

    pw = isub.add_parser("power", help="set the power utilisation figures")
    pw.add_argument("--device", type=int, required=True)
    pw.add_argument("--min", type=int, required=True, dest="min_power")
    pw.add_argument("--max", type=int, required=True, dest="max_power")
    pw.add_argument("--avg", type=int, required=True, dest="avg_power")
    pw.add_argument("--status", type=int, default=0)

    isub.add_parser("reboot", help="new boot id and an empty kernel log, as after a reboot")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (sim.SimError, UnknownInstanceTypeError) as exc:
        print(f"neuron-sim: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"neuron-sim: error: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.command == "create":
        it = sim.create(
            args.root, args.instance_type, args.lnc, args.char_devices, args.force, driver_version=args.driver_version
        )
        alias = f", the hardware of {it.name}" if it.name != args.instance_type else ""
        print(f"created a simulated {args.instance_type} ({it.devices} devices{alias}) under {args.root}")
        return 0
    if args.command == "create-ultraserver":
        roots = sim.create_ultraserver(
            args.root, args.instance_type, args.nodes, args.server_id, force=args.force, char_devices=args.char_devices
        )
        print(f"created an UltraServer of {len(roots)} {args.instance_type} nodes under {args.root}")
        return 0
    if args.command == "create-non-neuron":
        sim.create_non_neuron(args.root, args.instance_type, args.force)
        print(f"created a simulated {args.instance_type} without Neuron devices under {args.root}")
        return 0
    if args.command == "faults":
        print(faults.remediation_table() if args.ladder else faults.markdown_table())
        return 0
    if args.command == "monitor":
        from neuron_sim import monitor

        try:
            node = monitor.node_from_root(args.root) if args.root else monitor.node_from_type(args.instance_type)
            period = monitor.config_period(args.config_file, args.period)
        except ValueError as exc:
            raise sim.SimError(str(exc)) from exc
        scenario = monitor.Scenario(
            args.runtimes, args.cores_per_runtime, args.churn_every, args.malformed_every, args.runtimes_file, args.seed
        )
        return monitor.run(node, scenario, period, count=args.count, exit_after=args.exit_after)
    if args.command == "driver":
        return sim.serve_driver(args.root, args.interval, args.heartbeat_every, args.count, out=sys.stdout)
    if args.command == "destroy":
        sim.destroy(args.root)
        return 0
    root: Path = args.root
    sim.load_state(root)  # a clear error when there is no node here
    what = args.what
    if what == "counter":
        if args.raw is not None:
            sim.set_counter_raw(root, args.device, args.name, args.raw, args.core, args.field)
        else:
            print(sim.bump_counter(root, args.device, args.name, args.core, args.field, args.by))
    elif what == "hw-error":
        print(sim.inject_hw_error(root, args.kind, args.device, args.core, args.action, args.serial))
    elif what == "fault":
        print(sim.inject_fault(root, args.kind, args.device, args.via, args.core, args.transient))
    elif what == "unhealthy-components":
        print(
            sim.set_unhealthy_components(
                root, args.device, args.components.split(","), transient=args.transient.split(",")
            )
        )
    elif what == "reset":
        print(", ".join(sim.reset_device(root, args.device)) or "nothing ended")
    elif what == "heartbeat-stall":
        print(sim.stall_heartbeat(root, args.device, args.persistent))
    elif what == "heartbeat-resume":
        print(sim.resume_heartbeat(root, args.device, args.mended))
    elif what == "heartbeat":
        print(sim.beat_heartbeat(root, args.device, args.value))
    elif what == "move-node":
        print(sim.move_node(root, args.device, args.path, args.to))
    elif what == "reload-driver":
        sim.reload_driver(root)
    elif what == "kmsg":
        if args.raw:
            sim.append_raw_kmsg(root, args.message)
        else:
            print(sim.append_kmsg(root, args.message, args.priority))
    elif what == "vanish":
        sim.vanish(root, args.device)
    elif what == "restore":
        sim.restore(root, args.device)
    elif what == "memory":
        sim.set_memory(root, args.device, args.category, args.present, args.core, args.location)
    elif what == "power":
        sim.set_power(root, args.device, args.min_power, args.max_power, args.avg_power, args.status)
    elif what == "reboot":
        print(sim.reboot(root))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
