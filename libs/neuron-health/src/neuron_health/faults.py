"""The Neuron hardware fault table: every fault kind the stack knows, once.

Each row says where a fault shows (the runtime's `NEURON_HW_ERR=<NAME>` kernel lines, a driver
message, the driver's device counters `stats/hardware/<name>`, the per-core execution status
counters `stats/status/<name>/total`), how bad it is, and the NodeCondition or Event reason it
is reported under. The device plugin's health, the problem detector's default rules (and so the
chart's rules file), the exporter's `fault`/`severity` labels and `neuron-sim inject` all read
this table; `tests` fail when one of them disagrees with it.

Severities (`shared/reference/neuron-stack.md` section 3, "Kernel log" and the runtime codes
`NRT_EXEC_HW_ERR_*`):
- `transient`: worth an Event; the device stays allocatable and no condition is set.
- `until-reboot`: the device leaves allocatable and `NeuronHealth` turns True until the driver
  is reloaded (its counters reset) or the node boots again.
- `replace-instance`: the device leaves allocatable and `NeuronHealth` turns True until the node
  boots again; the instance should be replaced (a driver reload does not mend the silicon).

- `multi-node-unfit`: a link of the device to other nodes (or to its peers in the server) is down
  (the firmware's `link_*` verdicts, driver 2.30.2): the device stays allocatable and serves work on
  this node, and the node is unfit for work that spans nodes (an UltraServer group, an EFA job). The
  detector reports it as an Event; like `transient`, it never takes the device out.

A transient fault never takes a device out: the problem detector hands the device plugin only
the problems that set a condition, so a transient fault that removed a device would act
differently depending on which components are installed.

Each fault also has its rung on the remediation ladder (`Fault.rung`, docs/remediation.md): what
the fleet does about it. A rung follows from the severity, except two the node agent acts on first:
the validation in place (`validated_in_place`: a stalled firmware heartbeat leaves a device
unchecked, not known broken, so it is validated where it stands, without a drain, and a failure
escalates to the rung its severity names), and the device reset, which a fault reaches only when
`cleared_by_device_reset` says a reset of the device clears it. No fault says so
today: the driver's `reset` node resets a device that no process holds open
(shared/reference/neuron-stack.md, section 2), and neither AWS's documentation nor the driver's
source says which fault a reset clears. A fault gets the property only with such a source, named in
its `why`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType

from neuron_driver import layout
from neuron_driver.kmsg import search
from neuron_model import node_health


class Severity(enum.StrEnum):
    TRANSIENT = "transient"
    MULTI_NODE_UNFIT = "multi-node-unfit"
    UNTIL_REBOOT = "until-reboot"
    REPLACE_INSTANCE = "replace-instance"

    @property
    def takes_device_out(self) -> bool:
        """The one name for "takes the device out of service": the device plugin advertises it
        Unhealthy (it leaves allocatable), the DRA driver drops or taints it in its slices, and the
        problem detector sets the `NeuronHealth` condition and writes the device's verdict."""
        return self not in (Severity.TRANSIENT, Severity.MULTI_NODE_UNFIT)

    @property
    def unfit_for_multi_node(self) -> bool:
        """The device serves work on this node but not work spanning nodes (a link fault)."""
        return self is Severity.MULTI_NODE_UNFIT

    @property
    def clears_on_driver_reload(self) -> bool:
        return self is Severity.UNTIL_REBOOT


class Rung(enum.StrEnum):
    """The remediation ladder's rungs, mildest first."""

    EVENT = "event"  # an Event; the device stays in service
    # the node agent validates the device where it stands: no drain, no reset of a held device; a failed
    # validation escalates (`Fault.escalated_rung`)
    VALIDATE = "validate"
    DEVICE_RESET = "device-reset"  # the node agent resets the idle device, then validates it
    REBOOT = "reboot"  # cordon, drain, reboot, validate
    REPLACE = "replace"  # cordon, drain, ask for a new instance

    @property
    def needs_new_boot_or_instance(self) -> bool:
        """`AcceleratedHardwareReady` turns False: EKS node auto repair and Karpenter replace such a node."""
        return self in (Rung.REBOOT, Rung.REPLACE)

    @property
    def node_agent_first(self) -> bool:
        """The node agent acts first (a validation, a reset); the fleet acts only when it escalates."""
        return self in (Rung.VALIDATE, Rung.DEVICE_RESET)


CONDITION = node_health.CONDITION
HEALTHY_REASON = "NeuronHasNoError"
HEALTHY_MESSAGE = "No Neuron hardware errors on this boot"

# The line's own verdict on an unknown NEURON_HW_ERR kind: the runtime asks for a new instance.
TERMINATE_ACTION = "TERMINATE_INSTANCE"


@dataclass(frozen=True)
class Fault:
    kind: str
    severity: Severity
    reason: str  # NodeCondition reason (condition-setting faults) or Event reason (transient ones)
    why: str  # one line: why this severity
    kernel_names: tuple[str, ...] = ()  # NEURON_HW_ERR=<name>, written by the runtime
    driver_pattern: str | None = None  # a driver message; the named group `device` is the device index
    device_counters: tuple[str, ...] = ()  # stats/hardware/<name>
    core_counters: tuple[str, ...] = ()  # stats/status/<name>/total on any of the device's cores
    cleared_by_device_reset: bool = False  # only with a source saying so (see the module's docstring)
    # the device is not known to be broken, only unchecked: validated in place before any drain
    validated_in_place: bool = False

    @property
    def takes_device_out(self) -> bool:
        return self.severity.takes_device_out

    @property
    def rung(self) -> Rung:
        if not self.severity.takes_device_out:  # transient, multi-node-unfit: the device stays in service
            return Rung.EVENT
        if self.cleared_by_device_reset:
            return Rung.DEVICE_RESET
        if self.validated_in_place:
            return Rung.VALIDATE
        return self.escalated_rung

    @property
    def escalated_rung(self) -> Rung:
        """The rung of a new boot or instance this fault asks for, at once or once the node agent's
        validation or reset failed: what its severity says mends it."""
        return Rung.REBOOT if self.severity is Severity.UNTIL_REBOOT else Rung.REPLACE

    @property
    def accelerated_hardware_reason(self) -> str:
        """The `AcceleratedHardwareReady` reason, in the form of EKS's node monitoring agent: its four
        (`NeuronSRAMUncorrectableError`, `NeuronNCUncorrectableError`, `NeuronHBMUncorrectableError`,
        `NeuronDMAError`) come out of this rule unchanged, so alerts and repair policies keyed on them hold."""
        words = self.kind.split("_")
        return "Neuron" + "".join(w if w in _ACRONYMS else w.capitalize() for w in words)

    @property
    def kernel_pattern(self) -> str | None:
        """The regular expression searched in kernel log messages."""
        if self.kernel_names:
            names = "|".join(re.escape(n) for n in self.kernel_names)
            return f"NEURON_HW_ERR=(?:{names})\\b" if len(self.kernel_names) > 1 else f"NEURON_HW_ERR={names}\\b"
        return self.driver_pattern

    @property
    def counters(self) -> tuple[str, ...]:
        return self.device_counters + self.core_counters


_ACRONYMS = frozenset({"SRAM", "HBM", "NC", "DMA", "HW", "EFA", "API", "AXI"})


def _hw(
    kind: str, severity: Severity, why: str, device_counters: tuple[str, ...] = (), core_counters: tuple[str, ...] = ()
) -> Fault:
    # AWS's own detector names its reasons NeuronHasError_<KIND>; keeping them keeps users' alerts working.
    return Fault(
        kind,
        severity,
        f"NeuronHasError_{kind}",
        why,
        kernel_names=(kind,),
        device_counters=device_counters,
        core_counters=core_counters,
    )


FAULTS: tuple[Fault, ...] = (
    _hw(
        "SRAM_UNCORRECTABLE_ERROR",
        Severity.REPLACE_INSTANCE,
        "uncorrectable SRAM ECC: the runtime asks for a new instance (action=TERMINATE_INSTANCE)",
        device_counters=("sram_ecc_uncorrected",),
    ),
    _hw(
        "NC_UNCORRECTABLE_ERROR",
        Severity.REPLACE_INSTANCE,
        "NRT_EXEC_HW_ERR_NC_UE (1202): a NeuronCore is broken; only repairable HBM errors mend with a reload",
        core_counters=("hw_nc_ue_error",),
    ),
    _hw(
        "HBM_UNCORRECTABLE_ERROR",
        Severity.REPLACE_INSTANCE,
        "NRT_EXEC_HW_ERR_HBM_UE (1201): uncorrectable device memory; the runtime's guide says replace the instance",
        device_counters=("mem_ecc_uncorrected",),
        core_counters=("hw_hbm_ue_error",),
    ),
    _hw(
        "DMA_ERROR",
        Severity.REPLACE_INSTANCE,
        "NRT_EXEC_HW_ERR_DMA_ABORT (1203): not among the repairable kinds, so the guide says replace the instance",
        core_counters=("hw_dma_abort_error",),
    ),
    _hw(
        "HBM_REPAIRABLE_UNCORRECTABLE_ERROR",
        Severity.UNTIL_REBOOT,
        "NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE (1205): the guide says reload the driver or reboot, and that repairs it",
        device_counters=("mem_ecc_repairable_uncorrected",),
        core_counters=("hw_repairable_hbm_ue_error",),
    ),
    Fault(
        "HANG_ON_COLLECTIVES",
        Severity.TRANSIENT,
        "NeuronHangOnCollectives",
        "NRT_EXEC_HW_ERR_COLLECTIVES (1200): a collective waits on its peers or the network, not on this "
        "device's silicon; AWS dropped it from its permanent rules after chart 1.0.0",
        kernel_names=("HANG_ON_COLLECTIVES",),
        core_counters=("hw_collectives_error",),
    ),
    Fault(
        "DMA_COMPLETION_TIMEOUT",
        Severity.TRANSIENT,
        "NeuronDMACompletionTimeout",
        "the driver times out one DMA and carries on; a NEURON_HW_ERR line follows if the device is broken",
        driver_pattern=r"DMA completion timeout on nd(?P<device>\d+)",
    ),
    Fault(
        "RESET_FAILED",
        Severity.TRANSIENT,
        "NeuronResetFailed",
        "the driver retries the reset on the next open; a device that stays broken shows in a NEURON_HW_ERR line",
        driver_pattern=r"nd(?P<device>\d+): reset request \d+ failed",
    ),
    Fault(
        "DMA_INIT_AFTER_RESET_FAILED",
        Severity.TRANSIENT,
        "NeuronDMAInitAfterResetFailed",
        "names no device, so it cannot take one out; an Event lets operators correlate it with a failing workload",
        driver_pattern=r"failed to initialize dma after reset",
    ),
)


def _firmware(component: str, severity: Severity, why: str) -> Fault:
    """A subsystem the firmware's verdict (`health_status/unhealthy_components`, driver 2.30.2) lists.
    AWS's release notes name the subsystems and nothing more: no action, no meaning beyond the name.
    So each severity follows the nearest fault AWS does give an action for, said in its `why`."""
    kind = f"UNHEALTHY_{component.upper()}"
    reason = f"NeuronHasError_{kind}" if severity.takes_device_out else f"NeuronUnhealthy_{component.upper()}"
    return Fault(kind, severity, reason, why, device_counters=(layout.firmware_counter(component),))


_LINK_WHY = (
    "the firmware's verdict lists this link failing: work on this node is unaffected, work spanning "
    "nodes or devices over it is not; no source names an action"
)

FIRMWARE_FAULTS: tuple[Fault, ...] = (
    _firmware("hbm", Severity.REPLACE_INSTANCE, "the firmware marks HBM failing: as HBM_UNCORRECTABLE_ERROR"),
    _firmware("sram", Severity.REPLACE_INSTANCE, "the firmware marks SRAM failing: as SRAM_UNCORRECTABLE_ERROR"),
    _firmware(
        "axi_fabric",
        Severity.REPLACE_INSTANCE,
        "the device's on-chip fabric is failing: silicon, which a reboot does not mend (as NC_UNCORRECTABLE_ERROR)",
    ),
    _firmware(
        "firmware_service_api",
        Severity.UNTIL_REBOOT,
        "a firmware service stopped answering: a reboot (or driver reload) starts the firmware afresh",
    ),
    _firmware(
        "firmware_service_processor",
        Severity.UNTIL_REBOOT,
        "the firmware's service processor failed: a reboot (or driver reload) starts it afresh",
    ),
    _firmware(
        "link_host",
        Severity.UNTIL_REBOOT,
        "the device's link to the host failed: nothing on this node can use the device until it is set up again",
    ),
    _firmware("link_efa", Severity.MULTI_NODE_UNFIT, _LINK_WHY),
    _firmware("link_interserver", Severity.MULTI_NODE_UNFIT, _LINK_WHY),
    _firmware("link_switch", Severity.MULTI_NODE_UNFIT, _LINK_WHY),
    _firmware("link_intraserver", Severity.MULTI_NODE_UNFIT, _LINK_WHY),
    Fault(
        "HEALTHCHECK_HEARTBEAT_STALE",
        Severity.UNTIL_REBOOT,
        "NeuronHasError_HEALTHCHECK_HEARTBEAT_STALE",
        "the firmware's health checks stopped (its heartbeat moved, then stood still): its verdict is no "
        "longer news, so the device takes no new work until it is validated in place or the firmware starts afresh",
        device_counters=(layout.HEARTBEAT_STALE_COUNTER,),
        validated_in_place=True,
    ),
)
FAULTS = FAULTS + FIRMWARE_FAULTS

# A NEURON_HW_ERR kind this table does not know: trust the line's own action.
UNKNOWN_FATAL = Fault(
    "UNKNOWN_HW_ERROR",
    Severity.REPLACE_INSTANCE,
    "NeuronHasError_UNKNOWN_HW_ERROR",
    "a kind newer than this table, whose line says action=TERMINATE_INSTANCE: the runtime's own verdict",
)
UNKNOWN_NOTICE = Fault(
    "UNKNOWN_HW_ERROR_NOTICE",
    Severity.TRANSIENT,
    "NeuronUnknownHardwareError",
    "a kind newer than this table with any other action: reported, the device stays in service",
)

BY_KIND: Mapping[str, Fault] = MappingProxyType({f.kind: f for f in (*FAULTS, UNKNOWN_FATAL, UNKNOWN_NOTICE)})
BY_KERNEL_NAME: Mapping[str, Fault] = MappingProxyType({n: f for f in FAULTS for n in f.kernel_names})
BY_COUNTER: Mapping[str, Fault] = MappingProxyType({c: f for f in FAULTS for c in f.counters})
KERNEL_NAMES: tuple[str, ...] = tuple(BY_KERNEL_NAME)
# The condition (or Event) reason a fault is reported under, back to the fault: the problem
# detector's per-device verdicts carry the reason, and the agents reading them want the fault.
BY_REASON: Mapping[str, Fault] = MappingProxyType({f.reason: f for f in (*FAULTS, UNKNOWN_FATAL, UNKNOWN_NOTICE)})


def unknown_kind_pattern(action: str | None) -> str:
    """Kernel lines whose NEURON_HW_ERR kind is not in the table, with (or without) `action`."""
    known = "|".join(re.escape(n) for n in KERNEL_NAMES)
    head = f"NEURON_HW_ERR=(?!(?:{known})\\b)[A-Z0-9_]+"
    if action is None:
        return head + f"(?!.*\\baction={re.escape(TERMINATE_ACTION)}\\b)"
    return head + f".*\\baction={re.escape(action)}\\b"


def kernel_rules() -> Iterator[tuple[Fault, str]]:
    """Every (fault, pattern) a kernel log reader searches for, the unknown kinds last."""
    for fault in FAULTS:
        pattern = fault.kernel_pattern
        if pattern is not None:
            yield fault, pattern
    yield UNKNOWN_FATAL, unknown_kind_pattern(TERMINATE_ACTION)
    yield UNKNOWN_NOTICE, unknown_kind_pattern(None)


@dataclass(frozen=True)
class KernelFault:
    fault: Fault
    device: int | None
    core: int | None
    serial: str | None


@cache
def _compiled() -> tuple[tuple[Fault, re.Pattern[str]], ...]:
    return tuple((f, re.compile(p)) for f, p in kernel_rules())


def match_kernel_line(message: str) -> list[KernelFault]:
    """The faults a kernel log message shows (usually none, at most one)."""
    return [KernelFault(*hit) for hit in search(_compiled(), message)]


def markdown_table() -> str:
    """The fault table as docs/device-plugin.md shows it (`neuron-sim faults`)."""
    rows = [
        "| Fault | Kernel log | Counters | Severity | Takes the device out | Reason | Why |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in (*FAULTS, UNKNOWN_FATAL, UNKNOWN_NOTICE):
        if f.kernel_names:
            where = ", ".join(f"`NEURON_HW_ERR={n}`" for n in f.kernel_names)
        elif f.driver_pattern:
            where = f"`{f.driver_pattern}`"
        elif f.counters:  # the firmware's verdict: it shows in no kernel line
            where = "-"
        else:
            where = "any other `NEURON_HW_ERR=` kind" + (", `action=TERMINATE_INSTANCE`" if f.takes_device_out else "")
        counters = ", ".join(f"`{c}`" for c in f.counters) or "-"
        out = "yes" if f.takes_device_out else "no"
        rows.append(f"| `{f.kind}` | {where} | {counters} | {f.severity} | {out} | `{f.reason}` | {f.why} |")
    return "\n".join(rows)


def remediation_table() -> str:
    """The ladder as docs/remediation.md shows it: each fault's rung and `AcceleratedHardwareReady` reason."""
    rows = [
        "| Fault | Severity | Rung | `AcceleratedHardwareReady` | Reason there |",
        "|---|---|---|---|---|",
    ]
    for f in (*FAULTS, UNKNOWN_FATAL, UNKNOWN_NOTICE):
        if f.rung.needs_new_boot_or_instance:
            ahr, reason = "False", f"`{f.accelerated_hardware_reason}`"
        elif f.rung.node_agent_first:
            ahr, reason = f"False once escalated ({f.escalated_rung})", f"`{f.accelerated_hardware_reason}`"
        else:
            ahr, reason = "unchanged", "-"
        rows.append(f"| `{f.kind}` | {f.severity} | {f.rung} | {ahr} | {reason} |")
    return "\n".join(rows)
