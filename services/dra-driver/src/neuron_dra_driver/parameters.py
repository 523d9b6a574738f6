"""Opaque device configuration in a claim (or its DeviceClass), as AWS's Neuron DRA driver takes it,
so AWS's published ResourceClaimTemplates run unchanged. Pure: the claim's allocation in, one
`RequestConfig` per request out, or `ConfigError` naming the field that is wrong.

The scheduler copies every opaque config that applies into `status.allocation.devices.config`,
class configs first, then the claim's own, each naming the requests it applies to (none: all).
Later entries win, so a claim's own setting overrides its class's, as the DRA API documents.

Kinds (AWS's DRA guide, `deploy/eks/dra.rst` of aws-neuron/aws-neuron-sdk):
- `NeuronConfig` with `logicalNeuronCore` (1 or 2): the logical NeuronCore setting the claim's
  containers run with (`NEURON_LOGICAL_NC_CONFIG`, and `NEURON_RT_VISIBLE_CORES` counted in it).
- `UltraServerConfig` with `ultraserverMode` (4 or 2: the nodes the job spans): the claim's containers
  get the runtime's UltraServer variables for the node's group of that size (`claims.ultraserver_env`).
Both kinds may configure one request; each sets its own field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from neuron_driver.layout import DRA_DRIVER_NAME as DRIVER
from neuron_model.instance_types import FAMILIES
from neuron_model.ultraserver import ENV_GROUP_SIZES

# AWS's group and its earlier beta spellings, all still in AWS's examples
API_VERSIONS = ("neuron.aws.com/v1", "neuron.aws.com/v1alphav1", "resource.neuron.aws.com/v1alphav1")
NEURON_CONFIG = "NeuronConfig"
ULTRASERVER_CONFIG = "UltraServerConfig"
# What some Neuron family accepts: all a claim can be refused for before it reaches a node. Whether this
# node's family accepts it is the node's to say (`claims.relogical`).
LOGICAL_NEURON_CORE_VALUES = tuple(sorted({lnc for family in FAMILIES.values() for lnc in family.supported_lnc}))
ULTRASERVER_MODE_VALUES = tuple(sorted(ENV_GROUP_SIZES))
FIELDS = {NEURON_CONFIG: "logicalNeuronCore", ULTRASERVER_CONFIG: "ultraserverMode"}  # each kind's one field
VALUES = {"logicalNeuronCore": LOGICAL_NEURON_CORE_VALUES, "ultraserverMode": ULTRASERVER_MODE_VALUES}


class ConfigError(ValueError):
    """A config in the claim this driver cannot apply; the message names the field."""


@dataclass(frozen=True)
class RequestConfig:
    logical_neuron_core: int | None = None  # None: the node's setting
    ultraserver_mode: int | None = None  # nodes of the UltraServer group the job spans; None: no UltraServer variables

    def merged(self, later: RequestConfig) -> RequestConfig:
        """`later`'s fields where it sets them, this one's elsewhere (a NeuronConfig and an
        UltraServerConfig for one request each set their own)."""
        return RequestConfig(
            later.logical_neuron_core if later.logical_neuron_core is not None else self.logical_neuron_core,
            later.ultraserver_mode if later.ultraserver_mode is not None else self.ultraserver_mode,
        )


def _choice(parameters: Mapping[str, Any], field: str, values: tuple[int, ...], where: str) -> int | None:
    value = parameters.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value not in values:
        raise ConfigError(f"{where}.parameters.{field} must be {' or '.join(map(str, values))}, not {value!r}")
    return value


def parse(parameters: object, where: str) -> RequestConfig:
    """One opaque config's `parameters`; `where` names it in errors (e.g. "config[0]")."""
    if not isinstance(parameters, Mapping):
        raise ConfigError(f"{where}.parameters must be an object, not {type(parameters).__name__}")
    api_version, kind = parameters.get("apiVersion"), parameters.get("kind")
    if api_version not in API_VERSIONS:
        raise ConfigError(f"{where}.parameters.apiVersion {api_version!r} is not one of {', '.join(API_VERSIONS)}")
    if not isinstance(kind, str) or kind not in FIELDS:
        raise ConfigError(f"{where}.parameters.kind {kind!r} is not {NEURON_CONFIG} or {ULTRASERVER_CONFIG}")
    unknown = sorted(set(parameters) - {"apiVersion", "kind", FIELDS[kind]})
    if unknown:
        raise ConfigError(f"{where}.parameters has unknown field(s) {', '.join(unknown)} for {kind}")
    value = _choice(parameters, FIELDS[kind], VALUES[FIELDS[kind]], where)
    if kind == ULTRASERVER_CONFIG:
        return RequestConfig(ultraserver_mode=value)
    return RequestConfig(logical_neuron_core=value)


def admission_facts() -> dict[str, Any]:
    """What the chart's admission policy refuses a config for (files/dra-opaque-config.yaml, written
    by `make dra-config`): the checks of `parse` that need no node."""
    return {
        "driver": DRIVER,
        "apiVersions": list(API_VERSIONS),
        "kinds": {kind: {field: list(VALUES[field])} for kind, field in FIELDS.items()},
    }


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
                    configs[name] = configs[name].merged(config)
    return configs
