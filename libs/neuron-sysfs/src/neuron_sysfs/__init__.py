"""Read the AWS Neuron driver's sysfs: devices, cores, logical-core setting, topology, counters."""

from neuron_sysfs.counters import CounterKey, CounterKind, CounterReader, CounterSnapshot
from neuron_sysfs.errors import IssueKind, ScanIssue, SysfsError, UnknownInstanceTypeError
from neuron_sysfs.instance_types import INSTANCE_TYPES, InstanceType, TopologyKind, get_instance_type
from neuron_sysfs.inventory import Device, LogicalCore, NodeInventory, scan
from neuron_sysfs.lnc import LncSetting, LncSource

__all__ = [
    "INSTANCE_TYPES",
    "CounterKey",
    "CounterKind",
    "CounterReader",
    "CounterSnapshot",
    "Device",
    "InstanceType",
    "IssueKind",
    "LncSetting",
    "LncSource",
    "LogicalCore",
    "NodeInventory",
    "ScanIssue",
    "SysfsError",
    "TopologyKind",
    "UnknownInstanceTypeError",
    "get_instance_type",
    "scan",
]
