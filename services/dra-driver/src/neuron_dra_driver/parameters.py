"""Opaque device configuration in a claim (or its DeviceClass), as AWS's Neuron DRA driver takes it,
so AWS's published ResourceClaimTemplates run unchanged. Pure: the claim's allocation in, one
`RequestConfig` per request out, or `ConfigError` naming the field that is wrong.

The scheduler copies every opaque config that applies into `status.allocation.devices.config`,
class configs first, then the claim's own, each naming the requests it applies to (none: all).
Later entries win, so a claim's own setting overrides its class's, as the DRA API documents.

Kinds (AWS's DRA guide, `deploy/eks/dra.rst` of aws-neuron/aws-neuron-sdk):
- `NeuronConfig` with `logicalNeuronCore` (1 or 2): the logical NeuronCore setting the claim's
  containers run with (`NEURON_LOGICAL_NC_CONFIG`, and `NEURON_RT_VISIBLE_CORES` counted in it).
- `UltraServerConfig` with `ultraserverMode`: needs the UltraServer's identity, which this driver
  does not have yet (issue 26): refused with that said, never silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from neuron_driver.layout import DRA_DRIVER_NAME as DRIVER

# AWS's group and its earlier beta spellings, all still in AWS's examples
API_VERSIONS = ("neuron.aws.com/v1", "neuron.aws.com/v1alphav1", "resource.neuron.aws.com/v1alphav1")
NEURON_CONFIG = "NeuronConfig"
ULTRASERVER_CONFIG = "UltraServerConfig"
LOGICAL_NEURON_CORE_VALUES = (1, 2)


class ConfigError(ValueError):
    """A config in the claim this driver cannot apply; the message names the field."""


@dataclass(frozen=True)
class RequestConfig:
    logical_neuron_core: int | None = None  # None: the node's setting


def parse(parameters: object, where: str) -> RequestConfig:
    """One opaque config's `parameters`; `where` names it in errors (e.g. "config[0]")."""
    if not isinstance(parameters, Mapping):
        raise ConfigError(f"{where}.parameters must be an object, not {type(parameters).__name__}")
    api_version, kind = parameters.get("apiVersion"), parameters.get("kind")
    if api_version not in API_VERSIONS:
        raise ConfigError(f"{where}.parameters.apiVersion {api_version!r} is not one of {', '.join(API_VERSIONS)}")
    if kind == ULTRASERVER_CONFIG:
        raise ConfigError(
            f"{where}.parameters.kind {ULTRASERVER_CONFIG}: this driver does not know the UltraServer this node"
            " belongs to yet, so it cannot honour ultraserverMode; use a claim without it"
        )
    if kind != NEURON_CONFIG:
        raise ConfigError(f"{where}.parameters.kind {kind!r} is not {NEURON_CONFIG} or {ULTRASERVER_CONFIG}")
    unknown = sorted(set(parameters) - {"apiVersion", "kind", "logicalNeuronCore"})
    if unknown:
        raise ConfigError(f"{where}.parameters has unknown field(s) {', '.join(unknown)} for {NEURON_CONFIG}")
    lnc = parameters.get("logicalNeuronCore")
    if lnc is None:
        return RequestConfig()
    if isinstance(lnc, bool) or not isinstance(lnc, int) or lnc not in LOGICAL_NEURON_CORE_VALUES:
        values = " or ".join(map(str, LOGICAL_NEURON_CORE_VALUES))
        raise ConfigError(f"{where}.parameters.logicalNeuronCore must be {values}, not {lnc!r}")
    return RequestConfig(logical_neuron_core=lnc)


def per_request(allocation: Mapping[str, Any], requests: Iterable[str]) -> dict[str, RequestConfig]:
    """Each of `requests`' config from the allocation's opaque configs for this driver."""
    wanted = sorted(set(requests))
    configs = {r: RequestConfig() for r in wanted}
    entries = ((allocation.get("devices") or {}).get("config")) or []
    if not isinstance(entries, list):
        raise ConfigError("status.allocation.devices.config must be a list")
    for i, entry in enumerate(entries):
        opaque = (entry or {}).get("opaque") if isinstance(entry, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != DRIVER:
            continue  # another driver's, or a structured config this driver does not take
        config = parse(opaque.get("parameters"), f"config[{i}] ({entry.get('source', 'FromClaim')})")
        applies_to = entry.get("requests") or wanted
        for request in applies_to:
            # a subrequest ("req/sub") is configured by its request's name too
            for name in wanted:
                if name == request or name.split("/", 1)[0] == request:
                    configs[name] = config
    return configs
