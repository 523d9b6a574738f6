"""`make cluster-down` leaves nothing of the cluster running (issue 28): after `make demo`, with
the kubelet in the middle of restarting the release's containers, no process is left in the
pods' cgroups, no `neuron-*` process runs, no port of the release is still held, and the
NetworkPolicy enforcer's chains and address sets are gone; nor is anything left of the second
cluster `make cluster-test` ran beside it.

Runs only with `-m cluster_down`, last in `make cluster-test`: it brings the cluster down.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest
from cluster_access import CLUSTER_DIR, CTR, REPO, kubectl

pytestmark = pytest.mark.cluster_down

RELEASE_PORTS = (9843,)  # the scheduler extender's, a host port the demo's release holds


def pod_cgroup_processes() -> dict[int, str]:
    """Every process in a pod cgroup (cgroupfs driver: kubepods under a v1 controller or v2's root)."""
    found: dict[int, str] = {}
    bases = [*Path("/sys/fs/cgroup").glob("*/kubepods"), Path("/sys/fs/cgroup/kubepods")]
    for base in bases:
        for procs in base.rglob("cgroup.procs") if base.is_dir() else ():
            for line in procs.read_text().split():
                found[int(line)] = procs.parent.as_posix()
    return found


SERVICE = re.compile(
    r"neuron[-_](device[-_]plugin|node[-_]metrics|problem[-_]detector|scheduler[-_]extender|dra[-_]driver)"
)


def neuron_processes() -> list[str]:
    """Processes of the release's services, wherever they run: nothing else on a test machine
    runs them while the cluster tests do, so after cluster-down any one of them is an orphan."""
    hits = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if SERVICE.search(cmdline) and "pytest" not in cmdline:
            hits.append(f"{proc.name}: {cmdline.strip()}")
    return hits


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def enforcer_state() -> list[str]:
    """What the NetworkPolicy enforcer (kube-router, tests/cluster/peers.sh) made: its iptables chains and ipsets."""
    chains = subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True).stdout
    sets = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True, check=True).stdout
    return [
        *(line for line in chains.splitlines() if re.match(r"-N KUBE-(ROUTER|NWPLCY|POD-FW)-", line)),
        *(f"ipset {name}" for name in sets.split() if name.startswith("KUBE-")),
    ]


# make cluster-test's second cluster (tools/cluster_stage.sh, tests/cluster/isolated.sh), down before this module runs
ISOLATED_DIR = REPO / ".run/isolated-cluster"


def test_the_second_cluster_left_no_process_mount_or_cgroup() -> None:
    """Its kubelet's cgroup root is neuron-<its directory's name> under each controller; its namespaces
    are kept by bind mounts under its directory; down.sh removes the pid file of each process it stops."""
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(ISOLATED_DIR) not in mounts, "the second cluster's namespaces are still mounted"
    assert sorted(Path("/sys/fs/cgroup").glob("*/neuron-*")) == [], "the second cluster's kubelet cgroups are left"
    alive = []
    for pidfile in ISOLATED_DIR.glob("*.pid"):
        if Path(f"/proc/{pidfile.read_text().strip()}").exists():
            alive.append(pidfile.stem)
    assert alive == [], f"processes of the second cluster still run: {alive}"


def test_cluster_down_after_the_demo_leaves_no_process_even_while_the_kubelet_restarts_containers() -> None:
    # make cluster-test ran the demo already (NEURON_DEMO_RAN), as soon as the e2e tests ended and
    # while the unit and integration stages still ran beside it; run on its own, this test runs it.
    if os.environ.get("NEURON_DEMO_RAN") != "1":
        demo = subprocess.run(
            [str(REPO / "tools/demo.sh")], cwd=REPO, capture_output=True, text=True, timeout=900, check=False
        )
        assert demo.returncode == 0, f"make demo failed:\n{demo.stdout[-3000:]}\n{demo.stderr[-3000:]}"
    running = kubectl("get", "pods", "-A", "--field-selector=status.phase=Running", "-o", "name").split()
    assert any("neuron" in name for name in running), f"the demo left no release pod running: {running}"
    assert pod_cgroup_processes(), (
        "no process in the pods' cgroups before cluster-down: the check below would prove nothing"
    )

    assert enforcer_state(), "the NetworkPolicy enforcer made no chain: the check below would prove nothing"

    # Kill every container so the kubelet is restarting them while cluster-down begins (the race
    # of the issue: a container restarted between the tasks' kill and the runtime's stop).
    tasks = subprocess.run([*CTR, "tasks", "ls", "-q"], capture_output=True, text=True, check=True).stdout.split()
    assert tasks, "the runtime reports no task"
    for task in tasks:
        subprocess.run([*CTR, "tasks", "kill", "-s", "SIGKILL", task], capture_output=True, check=False)

    down = subprocess.run(
        [str(REPO / "tests/cluster/down.sh")], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert down.returncode == 0, f"cluster-down failed:\n{down.stdout}\n{down.stderr}"
    log = down.stdout
    assert log.index("stopping kubelet") < log.index("container(s)") < log.index("stopping containerd"), log

    assert pod_cgroup_processes() == {}, f"processes left in the pods' cgroups:\n{log}"
    assert neuron_processes() == [], f"the release's services outlived cluster-down:\n{log}"
    for port in RELEASE_PORTS:
        assert not port_in_use(port), f"port {port} is still held after cluster-down"
    assert enforcer_state() == [], f"the NetworkPolicy enforcer's chains or sets outlived cluster-down:\n{log}"
    assert not (CLUSTER_DIR / "kubelet.pid").exists()
    assert not (CLUSTER_DIR / "containerd.pid").exists()
    shims = subprocess.run(
        ["pgrep", "-f", f"containerd-shim-runc-v2 .*{CLUSTER_DIR}"], capture_output=True, text=True, check=False
    )
    assert shims.stdout == "", f"runtime shims left: {shims.stdout}"


# --- a multi-node cluster (NODES=<n> make cluster-up, tests/cluster/nodes.sh) ------------------------


def multinode_leftovers(cluster_dir: Path) -> list[str]:
    """What a multi-node cluster at cluster_dir left in this network and mount namespace: its nodes'
    processes (each started with its node directory, under cluster_dir/nodes, on its command line),
    the mounts keeping their namespaces and private paths, the host ends of their veth pairs, the
    raw table's guard, its layout file. Its nodes' pods are in cgroups neuron-* (checked above)."""
    nodes_dir = f"{cluster_dir}/nodes/"
    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if nodes_dir in cmdline and "pytest" not in cmdline:
            left.append(f"process {proc.name}: {cmdline.strip()}")
    left += [f"mount {line.split()[4]}" for line in Path("/proc/self/mountinfo").read_text().splitlines()
             if line.split()[4].startswith(nodes_dir)]  # fmt: skip
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    left += [f"link {m}" for m in re.findall(r"^\d+: (neuron-n\d+)[@:]", links, re.MULTILINE)]
    raw = subprocess.run(["iptables", "-t", "raw", "-S"], capture_output=True, text=True, check=True).stdout
    left += [f"rule {line}" for line in raw.splitlines() if "neuron-test-nodes" in line]
    if (cluster_dir / "nodes.env").exists():
        left.append(f"{cluster_dir / 'nodes.env'}")
    return left


def test_no_node_of_a_multi_node_cluster_is_left() -> None:
    """After cluster-down, nothing of the nodes nodes.sh started: no process, mount, namespace (held only
    by those two), veth, rule, ipset (each node's went with its network namespace; this one's are
    checked above) or cgroup. Last in this module: the cluster is down by now."""
    ran = [d for d in (CLUSTER_DIR, ISOLATED_DIR) if list(d.glob("nodes/*/logs/kubelet.log"))]
    # make test runs no multi-node cluster yet: then nothing of one may be here either (never a skip,
    # which CI=true refuses)
    assert sorted(Path("/sys/fs/cgroup").glob("*/neuron-*")) == [], "a node's kubelet cgroups are left"
    for cluster_dir in ran or [CLUSTER_DIR]:
        assert multinode_leftovers(cluster_dir) == [], f"left by the multi-node cluster at {cluster_dir}"
