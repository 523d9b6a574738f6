"""The driver end to end on this machine: the real gRPC servers over unix sockets with the compiled
stubs as the kubelet, a real kube-apiserver for the slices and claims, a simulated Neuron node."""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from typing import Any

import grpc
import pytest
from dra_harness import Harness, admin_api, eventually
from standins.dra_kubelet import allocated_claim

from kubelet_api.dra_health.v1alpha1 import api_pb2 as health_pb
from kubelet_api.dra_health.v1alpha1 import api_pb2_grpc as health_grpc
from neuron_common.kube import ApiError
from neuron_health import faults
from neuron_model import resources
from neuron_sim import node as sim

pytestmark = [pytest.mark.asyncio, pytest.mark.integration]
# inf2.24xlarge's ring of 6: 6 arcs of each size from 2 to 5, and the whole ring
INF2_24_ARCS = 6 * 4 + 1


def claim_name() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


async def test_registers_as_a_dra_plugin(start_driver) -> None:  # type: ignore[no-untyped-def]
    h: Harness = await start_driver("inf2.xlarge", register=False)
    await eventually((h.dirs / "registry" / "neuron.aws.com-reg.sock").exists)
    info = await h.kubelet.register()
    assert info.type == "DRAPlugin"
    assert info.name == "neuron.aws.com"
    assert info.endpoint == str(h.dirs / "plugins" / "dra.sock")
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1alpha1.DRAResourceHealth"]
    await eventually(lambda: h.driver.ready()[0])
    assert await h.shutdown() == 0
    assert not (h.dirs / "registry" / "neuron.aws.com-reg.sock").exists()
    assert not (h.dirs / "plugins" / "dra.sock").exists()


async def test_slices_accepted_by_the_api_server(start_driver) -> None:  # type: ignore[no-untyped-def]
    h: Harness = await start_driver("trn2.48xlarge")
    await eventually(lambda: _has_devices(h, 16 + 64))
    objs = await h.slices()
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in objs} == {len(objs)}
    assert len({s["spec"]["pool"]["generation"] for s in objs}) == 1
    counters = [s for s in objs if s["spec"].get("sharedCounters")]
    assert len(counters) == 1  # one counter set, 16 counters
    device = next(d for s in objs for d in s["spec"].get("devices") or [] if d["name"] == "neurondevice5")
    assert device["attributes"]["resource.aws.com/devicegroup4_id"] == {"string": "4"}
    assert device["consumesCounters"][0]["counters"] == {"neurondevice5": {"value": "4"}}
    # unchanged content is not written again
    before = h.driver.metrics.slice_updates._value.get()
    assert await h.driver.publisher.sync() is False
    assert h.driver.metrics.slice_updates._value.get() == before


async def test_prepare_writes_cdi_and_unprepare_removes_it(start_driver) -> None:  # type: ignore[no-untyped-def]
    h: Harness = await start_driver("trn1.32xlarge")
    devices = [f"neurondevice{d}" for d in (4, 5, 6, 7)]
    claim = await allocated_claim(h.api, h.node, devices, name=claim_name())
    uid = claim["metadata"]["uid"]
    ref = (uid, "default", claim["metadata"]["name"])
    response = await h.kubelet.prepare(ref)
    result = response.claims[uid]
    assert result.error == ""
    assert [d.device_name for d in result.devices] == devices
    assert {d.pool_name for d in result.devices} == {h.node}
    assert [list(d.cdi_device_ids) for d in result.devices] == [[f"neuron.aws.com/claim={uid}-neuron"], [], [], []]
    spec = json.loads((h.cdi_dir / f"neuron.aws.com_claim-{uid}.json").read_text())
    (cdi_device,) = spec["devices"]
    assert cdi_device["name"] == f"{uid}-neuron"
    assert [n["path"] for n in cdi_device["containerEdits"]["deviceNodes"]] == [f"/dev/neuron{d}" for d in (4, 5, 6, 7)]
    assert "NEURON_RT_VISIBLE_CORES=8,9,10,11,12,13,14,15" in cdi_device["containerEdits"]["env"]
    # idempotent: the same answer again
    assert (await h.kubelet.prepare(ref)).claims[uid] == result
    assert h.driver.metrics.prepared_claims._value.get() == 1
    unprepared = await h.kubelet.unprepare(ref)
    assert unprepared.claims[uid].error == ""
    assert not (h.cdi_dir / f"neuron.aws.com_claim-{uid}.json").exists()
    assert (await h.kubelet.unprepare(ref)).claims[uid].error == ""  # again: still fine
    assert h.driver.metrics.prepared_claims._value.get() == 0


async def test_refusals_name_the_reason(start_driver) -> None:  # type: ignore[no-untyped-def]
    h: Harness = await start_driver("inf2.24xlarge")
    claim = await allocated_claim(h.api, h.node, ["neurondevice0"], name=claim_name())
    name = claim["metadata"]["name"]
    wrong_uid = str(uuid.uuid4())
    other_node = await allocated_claim(h.api, "another-node", ["neurondevice0"], name=claim_name())
    missing = str(uuid.uuid4())
    response = await h.kubelet.prepare(
        (wrong_uid, "default", name),
        (other_node["metadata"]["uid"], "default", other_node["metadata"]["name"]),
        (missing, "default", "no-such-claim"),
    )
    assert "UID" in response.claims[wrong_uid].error
    assert "pool 'another-node'" in response.claims[other_node["metadata"]["uid"]].error
    assert "not found" in response.claims[missing].error
    assert not list(h.cdi_dir.glob("*.json"))


async def test_a_device_error_taints_it_and_its_cores_and_refuses_untolerating_claims(start_driver) -> None:  # type: ignore[no-untyped-def]
    h: Harness = await start_driver("inf2.24xlarge")
    await eventually(lambda: _has_devices(h, 6 + 12 + INF2_24_ARCS))
    claim = await allocated_claim(h.api, h.node, ["neuroncore4", "neuroncore5"], name=claim_name())
    sim.inject_fault(h.root, "NC_UNCORRECTABLE_ERROR", 2, via="kernel")
    # the device, its cores and every ring arc it is in
    arcs_with_2 = {
        resources.dra_group_name(k, first) for k in range(2, 7) for first in range(6 if k < 6 else 1)
        if 2 in resources.ring_arc(first, k, 6)
    }  # fmt: skip
    assert len(arcs_with_2) == 2 + 3 + 4 + 5 + 1
    await eventually(lambda: _tainted_are(h, {"neurondevice2", "neuroncore4", "neuroncore5", *arcs_with_2}))
    assert await _has_devices(h, 6 + 12 + INF2_24_ARCS)  # kept in the slices, with the taint the API server stored
    device = await _device(h, "neurondevice2")
    (taint,) = device["taints"]
    assert (taint["key"], taint["value"], taint["effect"]) == (
        "neuron.aws.com/unhealthy",
        "NC_UNCORRECTABLE_ERROR",
        "NoSchedule",
    )
    assert h.driver.metrics.tainted_devices._value.get() == 3 + len(arcs_with_2)
    assert h.driver.metrics.unhealthy_devices._value.get() == 1
    assert h.driver.metrics.taints_kept._value.get() == 1
    uid = claim["metadata"]["uid"]
    response = await h.kubelet.prepare((uid, "default", claim["metadata"]["name"]))
    assert "neuron2: kernel NC_UNCORRECTABLE_ERROR" in response.claims[uid].error
    # a claim whose allocation tolerates the taint (an admin's diagnostic pod) gets the device
    toleration = {"key": "neuron.aws.com/unhealthy", "operator": "Exists", "effect": "NoSchedule"}
    tolerant = await allocated_claim(h.api, h.node, ["neurondevice2"], name=claim_name(), tolerations=[toleration])
    tuid = tolerant["metadata"]["uid"]
    assert (await h.kubelet.prepare((tuid, "default", tolerant["metadata"]["name"]))).claims[tuid].error == ""
    # the kubelet's health stream says the same
    async with grpc.aio.insecure_channel(f"unix://{h.kubelet.endpoint}") as ch:
        stream = health_grpc.DRAResourceHealthStub(ch).NodeWatchResources(health_pb.NodeWatchResourcesRequest())
        first = await stream.read()
        stream.cancel()
    health = {d.device.device_name: d for d in first.devices}
    assert health["neurondevice2"].health == health_pb.UNHEALTHY
    assert "NC_UNCORRECTABLE_ERROR" in health["neuroncore5"].message
    assert health["neurondevice1"].health == health_pb.HEALTHY


async def test_restart_keeps_prepared_claims(start_driver) -> None:  # type: ignore[no-untyped-def]
    h: Harness = await start_driver("trn1.32xlarge")
    claim = await allocated_claim(h.api, h.node, ["neurondevice0"], name=claim_name())
    uid, name = claim["metadata"]["uid"], claim["metadata"]["name"]
    first = (await h.kubelet.prepare((uid, "default", name))).claims[uid]
    assert first.error == ""
    assert await h.shutdown() == 0
    # the claim object is gone: only the checkpoint can answer now
    await h.api.delete(f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}")
    again: Harness = await start_driver(node=h.node, root=h.root, dirs=h.dirs)
    assert (await again.kubelet.prepare((uid, "default", name))).claims[uid] == first
    assert (await again.kubelet.unprepare((uid, "default", name))).claims[uid].error == ""
    assert not list(again.cdi_dir.glob("*.json"))


async def test_a_reboot_that_empties_the_cdi_directory_loses_no_claim(start_driver) -> None:  # type: ignore[no-untyped-def]
    """/var/run/cdi is a tmpfs: after a reboot the kubelet restarts the pod's containers, naming the
    claim's CDI device, and asks the driver again; the spec must be there though the API server
    is not asked (here the claim object is even gone)."""
    h: Harness = await start_driver("trn1.32xlarge")
    claim = await allocated_claim(h.api, h.node, ["neurondevice2", "neurondevice3"], name=claim_name())
    uid, name = claim["metadata"]["uid"], claim["metadata"]["name"]
    first = (await h.kubelet.prepare((uid, "default", name))).claims[uid]
    assert first.error == ""
    spec_file = h.cdi_dir / f"neuron.aws.com_claim-{uid}.json"
    spec_before = json.loads(spec_file.read_text())
    assert await h.shutdown() == 0
    for spec in h.cdi_dir.glob("*.json"):  # the reboot
        spec.unlink()
    await h.api.delete(f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}")
    again: Harness = await start_driver(node=h.node, root=h.root, dirs=h.dirs)
    assert json.loads(spec_file.read_text()) == spec_before  # written at start, before any call
    assert again.driver.metrics.cdi_specs_restored._value.get() == 1
    assert (await again.kubelet.prepare((uid, "default", name))).claims[uid] == first
    # gone again while the driver runs: the next prepare writes it back
    spec_file.unlink()
    assert (await again.kubelet.prepare((uid, "default", name))).claims[uid] == first
    assert json.loads(spec_file.read_text()) == spec_before
    assert again.driver.metrics.cdi_specs_restored._value.get() == 2


async def test_a_checkpoint_without_specs_prepares_a_claim_whose_spec_is_gone_again(start_driver) -> None:  # type: ignore[no-untyped-def]
    """A checkpoint an older driver wrote has no spec copies: such a claim is prepared again from
    the API server, with the same devices, instead of answered with a spec that does not exist."""
    h: Harness = await start_driver("trn1.32xlarge")
    claim = await allocated_claim(h.api, h.node, ["neurondevice5"], name=claim_name())
    uid, name = claim["metadata"]["uid"], claim["metadata"]["name"]
    first = (await h.kubelet.prepare((uid, "default", name))).claims[uid]
    assert await h.shutdown() == 0
    checkpoint_file = h.dirs / "plugins" / "checkpoint.json"
    saved = json.loads(checkpoint_file.read_text())
    assert all("spec" in c for c in saved["claims"])
    for c in saved["claims"]:
        del c["spec"]
    checkpoint_file.write_text(json.dumps(saved))
    for spec in h.cdi_dir.glob("*.json"):
        spec.unlink()
    again: Harness = await start_driver(node=h.node, root=h.root, dirs=h.dirs)
    assert not list(again.cdi_dir.glob("*.json"))
    assert (await again.kubelet.prepare((uid, "default", name))).claims[uid] == first
    assert (again.cdi_dir / f"neuron.aws.com_claim-{uid}.json").exists()
    assert again.driver.metrics.cdi_specs_restored._value.get() == 0


async def test_corrupt_checkpoint_recovered_from_cdi_specs(start_driver) -> None:  # type: ignore[no-untyped-def]
    h: Harness = await start_driver("trn1.32xlarge")
    claim = await allocated_claim(h.api, h.node, ["neurondevice3"], name=claim_name())
    uid, name = claim["metadata"]["uid"], claim["metadata"]["name"]
    first = (await h.kubelet.prepare((uid, "default", name))).claims[uid]
    assert await h.shutdown() == 0
    (h.dirs / "plugins" / "checkpoint.json").write_text('{"version": 1, "claims": [')
    again: Harness = await start_driver(node=h.node, root=h.root, dirs=h.dirs)
    await eventually(lambda: again.driver.ready()[0])
    assert "recovered from CDI specs" in again.driver.ready()[1]
    await h.api.delete(f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}")
    assert (await again.kubelet.prepare((uid, "default", name))).claims[uid] == first
    assert list((h.dirs / "plugins").glob("checkpoint.json.corrupt-*"))


async def test_no_access_to_the_claim_is_an_error_not_a_crash(start_driver) -> None:  # type: ignore[no-untyped-def]
    h: Harness = await start_driver("inf2.xlarge")
    uid = str(uuid.uuid4())
    response = await h.kubelet.prepare((uid, "no-such-namespace", "x"))
    assert response.claims[uid].error
    assert h.driver.supervisor.healthy()[0]
    with pytest.raises(ApiError):
        await h.api.get("/apis/resource.k8s.io/v1/namespaces/no-such-namespace/resourceclaims/x")


async def _has_devices(h: Harness, count: int) -> bool:
    return len(await h.device_names()) == count


async def _lacks(h: Harness, names: set[str]) -> bool:
    return not (await h.device_names()) & names


async def _device(h: Harness, name: str) -> dict:  # type: ignore[type-arg]
    return next(d for s in await h.slices() for d in s["spec"].get("devices") or [] if d["name"] == name)


async def _tainted(h: Harness) -> set[str]:
    return {d["name"] for s in await h.slices() for d in s["spec"].get("devices") or [] if d.get("taints")}


async def _tainted_are(h: Harness, names: set[str]) -> bool:
    return await _tainted(h) == names


# The driver generations the simulator writes (driver_layout.SIMULATED), by sim.GENERATION_VERSIONS' version of each,
# as the other node agents' health tests run on them.
@pytest.mark.parametrize("driver_version", list(sim.GENERATION_VERSIONS.values()), ids=list(sim.GENERATION_VERSIONS))
async def test_each_generation_starts_clean_and_a_counter_error_taints(start_driver, short_tmp, driver_version) -> None:  # type: ignore[no-untyped-def]
    root = short_tmp / f"trn1-{driver_version}"
    sim.create(root, "trn1.32xlarge", driver_version=driver_version)
    h: Harness = await start_driver("trn1.32xlarge", "--heartbeat-stale-after", "90s", root=root)
    assert h.driver.layout.ok, h.driver.layout.lines()
    assert h.driver.metrics.health_sources_missing._value.get() == 0
    assert h.driver.monitor.watch.heartbeats.stale_after == 90  # the flag reaches the counter watch
    await eventually(lambda: _has_device(h, "neurondevice3"))
    sim.bump_counter(h.root, 3, "sram_ecc_uncorrected")
    await eventually(lambda: _device_tainted(h, "neurondevice3"))
    (taint,) = (await _device(h, "neurondevice3"))["taints"]
    assert (taint["key"], taint["value"]) == ("neuron.aws.com/unhealthy", "SRAM_UNCORRECTABLE_ERROR")
    assert h.driver.metrics.errors.labels("counters")._value.get() == 0  # health_status/ is no counter


async def test_a_moved_health_counter_is_logged_and_counted_at_start(start_driver, short_tmp, caplog) -> None:  # type: ignore[no-untyped-def]
    """Issue 57: a tree whose stats/hardware moved (as a driver that moved the node shows it) is never
    read as healthy in silence: the driver logs each path it cannot find and counts them in its gauge."""
    root = short_tmp / "trn2-moved"
    sim.create(root, "trn2.3xlarge", driver_version="2.30.2.0")
    sim.move_node(root, 0, "stats/hardware", "stats/hardware_v2")
    h: Harness = await start_driver("trn2.3xlarge", root=root)
    assert not h.driver.layout.ok
    # one device: 3 uncorrected and 2 corrected counts, health_status/'s 4 counters and the verdict's 2
    assert h.driver.metrics.health_sources_missing._value.get() == len(h.driver.layout.missing) == 3 + 2 + 4 + 2
    assert "health counters unreadable: stats/hardware/mem_ecc_uncorrected not found on neuron0" in caplog.text
    assert "found at stats/hardware_v2/mem_ecc_uncorrected" in caplog.text


async def test_the_firmwares_verdict_taints_a_failing_device_and_not_a_link_fault(start_driver, short_tmp) -> None:  # type: ignore[no-untyped-def]
    root = short_tmp / "trn2-2.30.2"
    sim.create(root, "trn2.48xlarge", driver_version="2.30.2.0")
    h: Harness = await start_driver(root=root)
    assert h.driver.layout.ok
    await eventually(lambda: _has_device(h, "neurondevice5"))
    sim.set_unhealthy_components(h.root, 6, ["link_efa"])  # unfit for multi-node work, not out of service
    sim.set_unhealthy_components(h.root, 5, ["hbm"])
    await eventually(lambda: _device_tainted(h, "neurondevice5"))
    (taint,) = (await _device(h, "neurondevice5"))["taints"]
    assert (taint["key"], taint["value"]) == ("neuron.aws.com/unhealthy", "UNHEALTHY_HBM")
    link = await _device(h, "neurondevice6")
    assert not link.get("taints")
    # in service for work on this node; a claim spanning nodes selects against the attribute
    assert link["attributes"]["multiNodeUnfit"] == {"string": "UNHEALTHY_LINK_EFA"}
    assert "multiNodeUnfit" not in (await _device(h, "neurondevice7"))["attributes"]
    sim.set_unhealthy_components(h.root, 6, [])  # the link is back: fit again
    await eventually(lambda: _attribute_gone(h, "neurondevice6", "multiNodeUnfit"))


async def _has_device(h: Harness, name: str) -> bool:
    return any(d["name"] == name for s in await h.slices() for d in s["spec"].get("devices") or [])


async def _attribute_gone(h: Harness, name: str, attribute: str) -> bool:
    return attribute not in (await _device(h, name))["attributes"]


async def _device_tainted(h: Harness, name: str) -> bool:
    return name in await _tainted(h)


async def test_without_device_taints_a_device_error_takes_it_out(start_driver) -> None:  # type: ignore[no-untyped-def]
    h: Harness = await start_driver("inf2.24xlarge", "--no-device-taints")
    await eventually(lambda: _has_devices(h, 6 + 12 + INF2_24_ARCS))
    sim.inject_fault(h.root, "NC_UNCORRECTABLE_ERROR", 2, via="kernel")
    await eventually(lambda: _lacks(h, {"neurondevice2", "neuroncore4", "neuroncore5"}))
    assert await h.device_names() >= {"neurondevice1", "neurondevice3"}
    assert not await _tainted(h)
    assert h.driver.metrics.unhealthy_devices._value.get() == 1


async def test_an_api_server_that_drops_taints_and_counters_gets_what_is_safe(
    start_driver, apiserver_without_taints
) -> None:  # type: ignore[no-untyped-def]
    """DRADeviceTaints and DRAPartitionableDevices off (1.34 and 1.35 by default): the stored slices
    would let a device and its cores go to two claims, and show a faulty device as allocatable; the
    driver sees what the server dropped and publishes whole devices only, leaving a faulty one out."""
    h: Harness = await start_driver("inf2.24xlarge", cp=apiserver_without_taints)
    # the shared counters are dropped too: cores could be handed out with their device, so none
    await eventually(lambda: _has_devices(h, 6))
    assert h.driver.publisher.counters_dropped
    assert h.driver.metrics.counters_kept._value.get() == 0
    assert await _lacks(h, {f"neuroncore{c}" for c in range(12)})
    assert h.driver.metrics.taints_kept._value.get() == 1
    sim.inject_fault(h.root, "NC_UNCORRECTABLE_ERROR", 2, via="kernel")
    await eventually(lambda: _lacks(h, {"neurondevice2"}))
    assert h.driver.metrics.taints_kept._value.get() == 0
    assert h.driver.publisher.taints_dropped
    assert not await _tainted(h)
    assert await _has_devices(h, 5)


async def test_recovery_removes_the_taint_and_the_effect_follows_the_severity(start_driver) -> None:  # type: ignore[no-untyped-def]
    h: Harness = await start_driver("trn1.32xlarge", "--taint-effect-until-reboot", "NoExecute")
    await eventually(lambda: _has_devices(h, 16 + 32))
    fault = next(f for f in faults.FAULTS if f.severity is faults.Severity.UNTIL_REBOOT and f.device_counters)
    sim.inject_fault(h.root, fault.kind, 6, via="device-counter")
    await eventually(lambda: _tainted_are(h, {"neurondevice6", "neuroncore12", "neuroncore13"}))
    (taint,) = (await _device(h, "neuroncore13"))["taints"]
    assert (taint["value"], taint["effect"]) == (fault.kind, "NoExecute")
    sim.reload_driver(h.root)  # the fault clears on a driver reload, after the quiet period
    await eventually(lambda: _tainted_are(h, set()), timeout=20)
    assert await _has_devices(h, 16 + 32)


async def test_credentials_from_a_kubeconfig_with_inline_data_reach_the_api_server(apiserver, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What `neuron-dra-driver --kubeconfig` loads without the kubernetes client: CA and client
    certificate inline, against the real API server."""
    import asyncio
    import base64
    import sys

    from neuron_common.kube import Api

    creds = apiserver.credentials
    inline = {
        "clusters": [{"name": "c", "cluster": {
            "server": apiserver.server, "certificate-authority-data": base64.b64encode(creds.ca.read_bytes()).decode()}}],
        "users": [{"name": "u", "user": {
            "client-certificate-data": base64.b64encode(creds.client_cert.read_bytes()).decode(),
            "client-key-data": base64.b64encode(creds.client_key.read_bytes()).decode()}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }  # fmt: skip
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(inline))
    api = Api.from_kubeconfig(str(path), 10.0)
    try:
        answer = await api.get("/apis/resource.k8s.io/v1")
        assert answer["groupVersion"] == "resource.k8s.io/v1"
    finally:
        await api.close()
    # and without importing the kubernetes client (18 MB resident), in a process of its own
    code = "import sys; from neuron_common.kube import Api; Api.from_kubeconfig(sys.argv[1], 1.0); "
    code += "print('kubernetes' in sys.modules)"
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, str(path), stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    assert out.decode().strip() == "False"


async def test_slices_the_kubelet_wiped_come_back_at_once(start_driver) -> None:  # type: ignore[no-untyped-def]
    h: Harness = await start_driver("inf2.xlarge")
    await eventually(lambda: _has_devices(h, 1 + 2))
    # what a starting kubelet does, maybe after the driver has published: wipe the node's slices
    for _ in range(2):
        for obj in await h.slices():
            await h.api.delete(f"/apis/resource.k8s.io/v1/resourceslices/{obj['metadata']['name']}")
        await eventually(lambda: _has_devices(h, 1 + 2))  # well before the 1-minute resync
    # and a kubelet registering the driver again makes it check at once too
    generation = h.driver.publisher.generation
    await h.kubelet.register()
    await eventually(lambda: h.driver.publisher.synced)
    assert h.driver.publisher.generation == generation  # nothing changed: nothing written


async def test_the_slices_carry_this_drivers_version(start_driver) -> None:  # type: ignore[no-untyped-def]
    from importlib.metadata import version

    h: Harness = await start_driver("trn1.2xlarge")
    await eventually(lambda: _has_devices(h, 1 + 2))
    device = next(d for s in await h.slices() for d in s["spec"].get("devices") or [] if d["name"] == "neurondevice0")
    assert device["attributes"]["draDriverVersion"] == {"version": version("neuron-dra-driver")}


async def test_the_nodes_placement_labels_reach_the_slices_and_follow_a_change(start_driver, apiserver) -> None:  # type: ignore[no-untyped-def]
    node = f"placed-{os.getpid()}-{int(time.time() * 1000) % 100000}"
    api = admin_api(apiserver)
    try:
        labels = {"topology.k8s.aws/network-node-layer-3": "nn-aaaa", "topology.k8s.aws/capacity-block-id": "cr-1"}
        await api.request("POST", "/api/v1/nodes", body={"metadata": {"name": node, "labels": labels}})
        h: Harness = await start_driver("trn1.2xlarge", "--resync-interval", "0.2", node=node)

        async def attributes() -> dict[str, Any]:
            devices = [d for s in await h.slices() for d in s["spec"].get("devices") or []]
            return next((d["attributes"] for d in devices if d["name"] == "neurondevice0"), {})

        async def layer3_is(value: str) -> bool:
            return (await attributes()).get("networkNodeLayer3") == {"string": value}

        await eventually(lambda: layer3_is("nn-aaaa"))
        assert (await attributes())["capacityBlockId"] == {"string": "cr-1"}
        patch = {"metadata": {"labels": {"topology.k8s.aws/network-node-layer-3": "nn-bbbb"}}}
        await api.request("PATCH", f"/api/v1/nodes/{node}", body=patch, content_type="application/merge-patch+json")
        await eventually(lambda: layer3_is("nn-bbbb"))
    finally:
        with contextlib.suppress(ApiError):
            await api.delete(f"/api/v1/nodes/{node}")
        await api.close()


async def test_a_node_it_cannot_read_leaves_the_placement_out_and_publishes_anyway(start_driver) -> None:  # type: ignore[no-untyped-def]
    h: Harness = await start_driver("trn1.2xlarge")  # no Node object of that name exists
    await eventually(lambda: _has_devices(h, 1 + 2))
    devices = [d for s in await h.slices() for d in s["spec"].get("devices") or []]
    assert not [k for d in devices for k in d["attributes"] if k.startswith(("networkNode", "capacityBlock"))]
    assert h.driver.metrics.errors.labels("node")._value.get() >= 1
