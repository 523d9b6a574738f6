"""An UltraServer as the Neuron driver describes it: the modes a node's UltraServer supports, and the
node's identity (the group's server id, the node's id in it) for each group size. Pure: the driver's
attributes are read by neuron_driver.ultraserver, written by neuron_sim.

Facts (aws-neuron-driver fca19f7, `share/neuron_driver_shared.h`, `v3/neuron_pelect.c`): mode 1 (X4)
groups 4 nodes, 2 (X2H) and 3 (X2V) group 2 over horizontal or vertical links, 4 (X1) is a node
alone. The 2-node attributes follow X2H where it is supported, else X2V; on a 4-node UltraServer the
2-node node id is remapped (X2H: 0,0,1,1; X2V: 0,1,0,1 by 4-node id).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


class Mode(enum.IntEnum):
    X4 = 1
    X2H = 2
    X2V = 3
    X1 = 4


NODES: Mapping[Mode, int] = MappingProxyType({Mode.X4: 4, Mode.X2H: 2, Mode.X2V: 2, Mode.X1: 1})
X4H_MAP = (0, 0, 1, 1)  # the 2-node id of each 4-node id over horizontal links
X4V_MAP = (0, 1, 0, 1)  # ... over vertical links
GROUP_SIZES = (4, 2)  # the sizes the driver names attributes for (node_id_4, server_id_2, ...)
NO_SERVER = "0" * 16  # what server_id reads when there is none, or none yet


def two_node_mode(modes: tuple[Mode, ...]) -> Mode | None:
    """The mode the driver's 2-node attributes describe (`npe_class_node_id_show_data` and
    `npe_class_server_id_show_data` in v3/neuron_pelect.c pick X2H, else X2V)."""
    if Mode.X2H in modes:
        return Mode.X2H
    if Mode.X2V in modes:
        return Mode.X2V
    return None


def modal_node_id(node_id: int, node_count: int, mode: Mode) -> int:
    """The node's id in a group of `mode`, from its id among `node_count` nodes (the driver's
    npe_get_modal_node_id); -1 where the node belongs to no such group."""
    if mode is Mode.X4:
        return node_id if node_count == 4 else -1
    if mode is Mode.X1:
        return -1
    if node_count == 4:
        return (X4H_MAP if mode is Mode.X2H else X4V_MAP)[node_id]
    return node_id


def pair_of(node_id: int, mode: Mode) -> int:
    """Which of a 4-node UltraServer's two pairs the node is in, in a 2-node mode: the nodes that
    share a 2-node server id (X2H pairs 0 with 2 and 1 with 3; X2V pairs 0 with 1 and 2 with 3)."""
    return node_id % 2 if mode is Mode.X2H else node_id // 2


@dataclass(frozen=True)
class UltraServerIdentity:
    """What a node of an UltraServer knows of it once the driver's election is over."""

    modes: tuple[Mode, ...]  # supported, as `ultraserver_mode` lists them
    server_ids: Mapping[int, str] = field(default_factory=dict)  # group size -> 16 hex digits
    node_ids: Mapping[int, int] = field(default_factory=dict)  # group size -> the node's id in that group

    def group(self, size: int) -> tuple[str, int] | None:
        """(server id, node id) of the node's group of `size` nodes, if it is in one."""
        if size in self.server_ids and size in self.node_ids:
            return self.server_ids[size], self.node_ids[size]
        return None


class State(enum.StrEnum):
    NONE = "none"  # not an UltraServer node (or a driver without UltraServer support)
    PENDING = "pending"  # the driver's election has not finished: no identity yet, ask again
    IDENTIFIED = "identified"
    INVALID = "invalid"  # the driver said `invalid`, or its attributes contradict each other


@dataclass(frozen=True)
class UltraServerReading:
    state: State
    identity: UltraServerIdentity | None = None
    reason: str = ""  # why PENDING or INVALID, naming the attribute


# -- AWS's node labels --------------------------------------------------------------------------------
# The keys are AWS's (its LeaderWorkerSet examples use the server ids as exclusive-topology keys). How
# the driver's values become label values is not published: AWS shows one row (`1_2_4`,
# 16-character ids, node ids as digits). Our mapping, kept here alone: the mode label lists the group
# sizes the node can run in, ascending, joined by `_` (for trn2u's X4, X2H and X1 that is `1_2_4`,
# which also reads as the driver's mode numbers 1, 2 and 4: the one published row cannot tell the
# two apart); each group size the node is in gets its server id and the node's id in it.
LABEL_PREFIX = "neuron.amazonaws.com/ultraserver-"
MODE_LABEL = LABEL_PREFIX + "mode"
LABELS_FIELD_MANAGER = "neuron-ultraserver-labels"  # the one writer of these labels, whichever agent runs


def server_id_label(size: int) -> str:
    return f"{LABEL_PREFIX}server-id-{size}"


def node_id_label(size: int) -> str:
    return f"{LABEL_PREFIX}node-id-{size}"


def topology_nodes(key: str) -> int | None:
    """How many nodes a group placed by the topology key spans: AWS's LeaderWorkerSet examples name
    `...-server-id-4` (or `-2`) as the exclusive topology of a group of 4 (or 2) nodes. None for any
    other key."""
    for size in GROUP_SIZES:
        if key == server_id_label(size):
            return size
    return None


def domain(reading: UltraServerReading | None, nodes: int) -> str | None:
    """The server id of the node's group of `nodes` nodes, when its UltraServer runs groups of that
    many (a mode it supports, as `env_mode` tells the runtime): the unit a job spanning `nodes`
    nodes is placed on, the value of the node's `server_id_label(nodes)`. None otherwise, including
    an identity not known yet: placing a group on a guess would split it."""
    if reading is None or reading.state is not State.IDENTIFIED or reading.identity is None:
        return None
    group = reading.identity.group(nodes)
    if group is None or env_mode(reading.identity.modes, nodes) is None:
        return None
    return group[0]


def node_labels(reading: UltraServerReading) -> dict[str, str]:
    """The labels a node carries for its UltraServer: all of them once identified, none otherwise
    (pending and invalid included: a label from an earlier identity would be a guess)."""
    identity = reading.identity
    if reading.state is not State.IDENTIFIED or identity is None:
        return {}
    labels = {MODE_LABEL: "_".join(str(n) for n in sorted({NODES[m] for m in identity.modes}))}
    for size in GROUP_SIZES:
        group = identity.group(size)
        if group is not None:
            labels[server_id_label(size)], node = group[0], group[1]
            labels[node_id_label(size)] = str(node)
    return labels


# -- The runtime's UltraServer variables --------------------------------------------------------------
# AWS's names and values (aws-neuron-sdk deploy/eks/ultraserver.rst and src/k8/k8s-ultraserver-init-script.sh,
# which writes them into each MPI worker pod's /etc/environment): the mode number, the group's server id
# and the node's id in it, as the driver's attributes for the job's group size read. Kept here alone: the
# DRA driver sets them for a claim's UltraServerConfig, the device plugin for a container holding all of a
# node's devices (--ultraserver-env).
#
# AWS's script also writes NEURON_GLOBAL_TOPOID and NEURON_GLOBAL_TOPOID0_HOST (`global_topology_env` below):
# facts of the whole job (every worker pod's identity and FQDN), which no node agent has: the kubelet's
# Allocate names neither the pod nor the job, and a job may span several UltraServer groups. So neither
# the device plugin nor a claim sets them; whoever knows the job's pods does.
MODE_ENV = "NEURON_RT_ULTRASERVER_MODE"
SERVER_ID_ENV = "NEURON_RT_ULTRASERVER_SERVER_ID"
NODE_ID_ENV = "NEURON_RT_ULTRASERVER_NODE_ID"
ENV_GROUP_SIZES = (2, 4)  # the job sizes the variables can be set for: a group the driver names ids for


def env_mode(modes: tuple[Mode, ...], nodes: int) -> Mode | None:
    """The mode the runtime is told for a job spanning `nodes` nodes, if the node supports one: X4 for
    4; for 2 the mode the driver's 2-node ids describe (`two_node_mode`: X2H where supported).

    Unconfirmed, and the one place to correct it: AWS's init script tells X2V (3) where a node supports
    both X2H and X2V, while the ids it sends with it (`server_id_2`, `node_id_2`) are the driver's X2H
    ones; we tell the mode those ids belong to. Published trn2u nodes (mode label `1_2_4`) support
    X2H only, where the two agree."""
    mode = Mode.X4 if nodes == 4 else two_node_mode(modes) if nodes == 2 else None
    return mode if mode is not None and mode in modes else None


def ultraserver_env(reading: UltraServerReading | None, nodes: int) -> dict[str, str]:
    """The runtime's UltraServer variables for a job spanning `nodes` nodes of this node's UltraServer,
    or ValueError, said so a pod's events explain it, when the identity is none, not known yet (the
    driver's election is running), unreadable, or has no group of `nodes` (AWS's script refuses these
    too): a job told another identity than the driver's would be a guess."""
    state = reading.state if reading is not None else State.NONE
    if reading is None or state is not State.IDENTIFIED or reading.identity is None:
        why = {State.PENDING: "is not known yet (the Neuron driver's election is running)",
               State.INVALID: "cannot be read",
               State.NONE: "is none: it is not an UltraServer node"}.get(state, "is missing")  # fmt: skip
        detail = f" ({reading.reason})" if reading is not None and reading.reason else ""
        raise ValueError(f"this node's UltraServer identity {why}{detail}")
    identity = reading.identity
    group = identity.group(nodes)
    mode = env_mode(identity.modes, nodes)
    if group is None or mode is None:
        supported = ", ".join(f"{NODES[m]} ({m.name})" for m in identity.modes)
        raise ValueError(f"this node is in no group of {nodes} nodes (its UltraServer supports: {supported or 'none'})")
    server_id, node_id = group
    return {MODE_ENV: str(int(mode)), SERVER_ID_ENV: server_id, NODE_ID_ENV: str(node_id)}


# -- The job's global topology ids ----------------------------------------------------------------------
# What AWS's init script (aws-neuron-sdk src/k8/k8s-ultraserver-init-script.sh; deploy/eks/ultraserver.rst:
# "NEURON_GLOBAL_TOPOID: The topology ID of the worker pod", "NEURON_GLOBAL_TOPOID0_HOST: The FQDN of the
# worker pod that's the leader (topology ID of 0)") writes into each worker pod: every worker reports
# `server_id:node_id:fqdn` (its node's ids for the job's group size, the pod's `hostname --fqdn`), the lines
# are sorted field by field (`sort -t: -k1,1 -k2,2 -k3,3`, as text) and numbered from 0; a pod's number is
# its NEURON_GLOBAL_TOPOID, the first line's FQDN everyone's NEURON_GLOBAL_TOPOID0_HOST. The operator's
# rule says the same for whole groups (`ultraserverIndex * nodeCount + nodeIndex`).
TOPOID_ENV = "NEURON_GLOBAL_TOPOID"
TOPOID0_HOST_ENV = "NEURON_GLOBAL_TOPOID0_HOST"


@dataclass(frozen=True)
class JobWorker:
    """One worker pod of a job, as AWS's script sees it."""

    server_id: str  # its node's server id for the job's group size (16 hex digits)
    node_id: int  # its node's id in that group
    fqdn: str  # the pod's fully qualified host name

    def sort_key(self) -> tuple[bytes, bytes, bytes]:
        # `sort -t: -k1,1 -k2,2 -k3,3` compares each field as text. Unconfirmed: byte order, as `sort` does
        # in the C locale; the script does not set one, and another locale's collation may order FQDNs
        # with `-` or `.` differently (ids, hex digits and digits, order alike in any locale).
        return (self.server_id.encode(), str(self.node_id).encode(), self.fqdn.encode())


def global_topology_env(workers: Iterable[JobWorker], worker: JobWorker) -> dict[str, str]:
    """NEURON_GLOBAL_TOPOID and NEURON_GLOBAL_TOPOID0_HOST for `worker`, one of the job's `workers`
    (ValueError when it is not one of them, or two workers share an FQDN)."""
    ordered = sorted(set(workers), key=JobWorker.sort_key)
    if len({w.fqdn for w in ordered}) != len(ordered):
        raise ValueError("two of the job's workers report the same FQDN")
    if worker not in ordered:
        raise ValueError(f"{worker.fqdn} is not one of the job's workers")
    return {TOPOID_ENV: str(ordered.index(worker)), TOPOID0_HOST_ENV: ordered[0].fqdn}
