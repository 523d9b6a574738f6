"""The host layout: every path on a Neuron node the stack reads or writes, written once.

Two kinds of path:
- under a host root (`HostLayout`): the driver's sysfs, `/dev/neuronN`, the kernel log, the
  boot id, the logical-core config; a simulated node puts them under another root, and a
  container sees the host's under a mount. Names follow `aws-neuron-driver` (`neuron_cdev.c`,
  `neuron_sysfs_metrics.c`), see `shared/reference/neuron-stack.md` section 3.
- absolute host paths the chart mounts at the same place in the container: the kubelet's
  sockets, the problem detector's state and verdicts, the CDI spec directory.
Every service and the simulator build paths through here; nothing else joins a root to a path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from neuron_model import resources

# -- relative to a host root ------------------------------------------------------------------
DEVICES_DIR = "sys/devices/virtual/neuron_device"
CLASS_DIR = "sys/class/neuron_device"
DEV_DIR = "dev"
NEURON_DIR = "opt/aws/neuron"  # where the Neuron SDK installs on a host: logical_nc_config, bin/neuron-monitor
LNC_CONFIG_FILE = f"{NEURON_DIR}/logical_nc_config"
DMI_PRODUCT_NAME = "sys/class/dmi/id/product_name"
PCI_DEVICES_DIR = "sys/bus/pci/devices"
KMSG_FILE = "dev/kmsg"
BOOT_ID_FILE = "proc/sys/kernel/random/boot_id"
DRIVER_VERSION_FILE = "sys/module/neuron/version"  # MODULE_VERSION of the loaded kernel driver, when it sets one
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"

# -- absolute host paths (the chart mounts each at the same path) ------------------------------
KUBELET_DIR = "/var/lib/kubelet"
DEVICE_PLUGIN_DIR = f"{KUBELET_DIR}/device-plugins/"  # the kubelet's kubelet.sock and plugin sockets
KUBELET_SOCKET_NAME = "kubelet.sock"
POD_RESOURCES_SOCKET = f"{KUBELET_DIR}/pod-resources/kubelet.sock"
NPD_STATE_DIR = "/var/lib/neuron-problem-detector"
NPD_STATE_FILE = f"{NPD_STATE_DIR}/state.json"
VERDICT_DIR = f"{NPD_STATE_DIR}/verdicts"  # the detector writes, the device plugin reads
CDI_SPEC_DIR = "/var/run/cdi"
DRA_DRIVER_NAME = resources.DRA_DRIVER
DRA_PLUGINS_DIR = f"{KUBELET_DIR}/plugins"  # a DRA driver's sockets and state live in <this>/<driver>/
DRA_REGISTRY_DIR = f"{KUBELET_DIR}/plugins_registry"  # the kubelet watches it for registration sockets
DRA_PLUGIN_DIR = f"{DRA_PLUGINS_DIR}/{DRA_DRIVER_NAME}"
DRA_SOCKET = f"{DRA_PLUGIN_DIR}/dra.sock"
DRA_REGISTRATION_SOCKET = f"{DRA_REGISTRY_DIR}/{DRA_DRIVER_NAME}-reg.sock"
DRA_CHECKPOINT_FILE = f"{DRA_PLUGIN_DIR}/checkpoint.json"


class _UnderRoot:
    """A path of `HostLayout`: `relative` joined to the layout's root."""

    def __init__(self, relative: str) -> None:
        self.relative = relative

    def __get__(self, layout: HostLayout, owner: type[HostLayout] | None = None) -> Path:
        return layout.root / self.relative


@dataclass(frozen=True)
class HostLayout:
    """The paths under one host root (`/` on a node, a directory for a simulated node)."""

    root: Path

    devices_dir = _UnderRoot(DEVICES_DIR)
    class_dir = _UnderRoot(CLASS_DIR)
    dev_dir = _UnderRoot(DEV_DIR)
    neuron_dir = _UnderRoot(NEURON_DIR)
    lnc_config = _UnderRoot(LNC_CONFIG_FILE)
    dmi_product_name = _UnderRoot(DMI_PRODUCT_NAME)
    pci_devices_dir = _UnderRoot(PCI_DEVICES_DIR)
    kmsg = _UnderRoot(KMSG_FILE)
    boot_id = _UnderRoot(BOOT_ID_FILE)
    driver_version = _UnderRoot(DRIVER_VERSION_FILE)

    def device_dir(self, index: int) -> Path:
        return self.devices_dir / f"neuron{index}"

    def class_link(self, index: int) -> Path:
        return self.class_dir / f"neuron{index}"

    def dev_node(self, index: int) -> Path:
        return self.dev_dir / f"neuron{index}"

    def reset_node(self, index: int) -> Path:
        """The driver's per-device reset node (`/sys/class/neuron_device/neuron<N>/reset`)."""
        return self.class_link(index) / RESET_FILE


# The per-device `reset` attribute (aws-neuron-driver neuron_cdev.c, `DEVICE_ATTR(reset, S_IWUSR |
# S_IRUSR, ...)`): any write asks for a reset of the whole device, which the driver starts only while
# no process holds the device open (`open_count == 0`); a read shows the device's state
# (`enum neuron_device_state`, neuron_device.h): 0 while a reset runs, 1 ready, 2 invalid (it failed).
RESET_FILE = "reset"
DEVICE_STATE_RESET = 0
DEVICE_STATE_READY = 1
DEVICE_STATE_INVALID = 2


DEVICE_NAME_RE = re.compile(r"^neuron(\d+)$")
CORE_DIR_RE = re.compile(r"^neuron_core(\d+)$")

# Per-core execution status counters: stats/status/<name>/{total,present}.
STATUS_NAMES: tuple[str, ...] = (
    "success",
    "failure",
    "timeout",
    "exec_bad_input",
    "hw_error",
    "execute_completed_with_error",
    "execute_completed_with_num_error",
    "generic_error",
    "resource_error",
    "resource_nc_error",
    "execute_failed_to_queue",
    "invalid_error",
    "unsupported_neff_version",
    "oob_error",
    "hw_collectives_error",
    "hw_hbm_ue_error",
    "hw_nc_ue_error",
    "hw_dma_abort_error",
    "execute_sw_nq_overflow",
    "execute_sw_semaphore_error",
    "execute_sw_event_error",
    "execute_sw_psum_collision",
    "execute_sw_sequencer_fatal",
    "hw_repairable_hbm_ue_error",
)

# The sysfs user guide documents older names for some statuses; drivers in the field still
# write them. Both map to one canonical name so dashboards see one series.
LEGACY_STATUS_NAMES: Mapping[str, str] = MappingProxyType(
    {
        "infer_completed_with_error": "execute_completed_with_error",
        "infer_completed_with_num_error": "execute_completed_with_num_error",
        "infer_failed_to_queue": "execute_failed_to_queue",
        "infer_timeout": "timeout",
        "infer_bad_input": "exec_bad_input",
        "infer_success": "success",
        "infer_failure": "failure",
    }
)

STATUS_FIELDS: tuple[str, ...] = ("total", "present")

HOST_MEM_CATEGORIES: tuple[str, ...] = (
    "dma_buffers",
    "tensors",
    "constants",
    "application_memory",
    "driver_memory",
    "notifications",
    "dma_rings",
    "uncategorized",
)

DEVICE_MEM_CATEGORIES: tuple[str, ...] = (
    "model_code",
    "tensors",
    "constants",
    "model_shared_scratchpad",
    "runtime_memory",
    "driver_memory",
    "collectives",
    "nonshared_scratchpad",
    "notifications",
    "dma_rings",
    "uncategorized",
)

MEM_FIELDS: tuple[str, ...] = ("total", "present", "peak")

HARDWARE_COUNTERS: tuple[str, ...] = (
    "sram_ecc_uncorrected",
    "mem_ecc_uncorrected",
    "mem_ecc_repairable_uncorrected",
)

# Driver 2.30.2 (AWS's release notes, `release-notes/components/runtime.rst`): correctable ECC counts.
# The notes name the nodes but not their directory; neither the docs nor the driver sources stored
# here say more, so they are taken to sit beside the uncorrected ones in stats/hardware/, and the
# layout check (`driver_layout`) names them when a 2.30.2 driver does not have them there.
CORRECTED_COUNTERS: tuple[str, ...] = ("sram_ecc_corrected", "mem_ecc_corrected")

# Driver 2.28.0: stats/hardware/health_status/, the firmware's cached health registers (read-only
# u32 values, sysfs_notify on a change). Names from aws-neuron-driver `neuron_sysfs_metrics.c`
# (`health_status_attrs_info_tbl`, aws-neuronx-dkms 2.28.0.0 and 2.29).
HEALTH_STATUS_DIR = "health_status"
HEALTH_STATUS_COUNTERS: tuple[str, ...] = (
    "hbm_ecc_err_count",
    "repairable_hbm_ecc_err_count",
    "sram_ecc_err_count",
    "hw_error_event",
)
# Driver 2.30.2, TRN2 and TRN3: the firmware's verdict, in health_status/ (release notes). The
# heartbeat's format is documented nowhere stored here: the stack treats its text as opaque and
# only asks whether it changes.
UNHEALTHY_COMPONENTS_FILE = "unhealthy_components"
HEARTBEAT_FILE = "healthcheck_heartbeat"
# The subsystems `unhealthy_components` names, comma-separated (release notes, driver 2.30.2).
UNHEALTHY_COMPONENTS: tuple[str, ...] = (
    "hbm",
    "sram",
    "firmware_service_api",
    "firmware_service_processor",
    "link_intraserver",
    "link_host",
    "link_efa",
    "link_interserver",
    "link_switch",
    "axi_fabric",
)

# The firmware's verdict as counters of the fault table, by (device, name) like the driver's own: 1
# while `unhealthy_components` lists the subsystem (or the heartbeat is stale), else 0. They are the
# stack's names, not files: the counter watch makes them from `unhealthy_components` and
# `healthcheck_heartbeat`, so the verdict flows through the one pipeline the counters do.
FIRMWARE_COUNTER_PREFIX = "unhealthy_components:"
HEARTBEAT_STALE_COUNTER = "healthcheck_heartbeat:stale"


def firmware_counter(component: str) -> str:
    return FIRMWARE_COUNTER_PREFIX + component


FIRMWARE_COUNTERS: tuple[str, ...] = (*(firmware_counter(c) for c in UNHEALTHY_COMPONENTS), HEARTBEAT_STALE_COUNTER)


def is_firmware_counter(name: str) -> bool:
    return name.startswith(FIRMWARE_COUNTER_PREFIX) or name == HEARTBEAT_STALE_COUNTER


OTHER_INFO: tuple[str, ...] = (
    "model_load_count",
    "reset_req_count",
    "reset_fail_count",
    "inference_count",
    "flop_count",
    "nc_time_in_use",
)


def canonical_status(name: str) -> str:
    return LEGACY_STATUS_NAMES.get(name, name)


def core_dir(device: Path, local_core: int) -> Path:
    return device / f"neuron_core{local_core}"


def status_file(core: Path, status: str, field: str) -> Path:
    return core / "stats" / "status" / status / field


def core_device_mem_file(core: Path, category: str, field: str) -> Path:
    return core / "stats" / "memory_usage" / "device_mem" / category / field


def core_mem_total_file(core: Path, location: str, field: str) -> Path:
    return core / "stats" / "memory_usage" / location / field


def core_other_info_file(core: Path, name: str) -> Path:
    return core / "stats" / "other_info" / name


def core_other_info_value_file(core: Path, name: str) -> Path:
    """The file holding an other_info counter's value. The driver makes each other_info node a counter
    node, as the status ones (`COUNTER_NODE_INFO` in neuron_sysfs_metrics.c: `<name>/total` and
    `<name>/present`), and so does the simulator; a plain file (as the simulator once wrote it) is read too.
    Its `total` where it is a directory, else the node."""
    node = core_other_info_file(core, name)
    return node / "total" if node.is_dir() else node


def device_host_mem_file(device: Path, category: str, field: str) -> Path:
    return device / "stats" / "memory_usage" / "host_mem" / category / field


def hardware_counter_file(device: Path, name: str) -> Path:
    return device / "stats" / "hardware" / name


def power_file(device: Path) -> Path:
    return device / "stats" / "power" / "utilization"


def hardware_dir(device: Path) -> Path:
    return device / "stats" / "hardware"


def health_status_dir(device: Path) -> Path:
    return hardware_dir(device) / HEALTH_STATUS_DIR


def health_status_file(device: Path, name: str) -> Path:
    return health_status_dir(device) / name


def power_raw_file(device: Path) -> Path:
    """Driver 2.29: live per-die power utilisation (release notes; `utilization_raw` in the driver)."""
    return device / "stats" / "power" / "utilization_raw"
