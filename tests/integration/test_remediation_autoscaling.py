"""The remediation controller with the Auto Scaling backend (`--replacement-backend=autoscaling`, what
the chart renders for AWS's `npd.nodeRecovery.enabled=true`), end to end: a real kube-apiserver
(tests/simcluster) and moto's server mode as AWS (tests/standins/aws.py), which checks each request's
signature and holds the controller to exactly the documented IAM policy.

n1's instance (its spec.providerID) is first in no Auto Scaling group: after the drain the request
fails with a `ReplacementRequestFailed` Event, the workflow stays where it was, and it is asked again
at every pass. Once the instance joins the group, the next pass marks it Unhealthy there (as AWS's
SDK reads it back) and the workflow moves on with a `ReplacementRequested` Event naming the group.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from integration.test_remediation import NODES, STACK, Cluster, _phase, _run, node_object, until
from simcluster.controlplane import control_plane, free_port
from skips import require
from standins import aws as stand_in

from neuron_common.kube import Api, ApiError
from neuron_model import remediation
from neuron_model.remediation import Phase
from neuron_remediation import config as remediation_config
from neuron_remediation.app import Remediator
from neuron_remediation.replacement import IAM_POLICY, AutoScalingBackend

pytestmark = [pytest.mark.integration]

ADMIN = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
REQUESTS = "neuron_remediation_replacement_requests_total"


@contextlib.asynccontextmanager
async def controller(kubeconfig: Path, endpoint: str) -> AsyncIterator[Remediator]:
    argv = [
        f"--kubeconfig={kubeconfig}", "--listen=127.0.0.1:0", "--max-nodes=10", "--max-percent=25",
        "--resync=1s", f"--lease-namespace={STACK}", f"--keep-namespaces={STACK}", "--no-leader-elect",
        "--replacement-backend=autoscaling", f"--autoscaling-endpoint={endpoint}",
    ]  # fmt: skip
    config = remediation_config.parse(argv, env={"POD_NAME": "remediator"})
    stop = asyncio.Event()
    r = Remediator(config, stop)  # the backend the flags name, with the credentials of the environment
    running = asyncio.create_task(r.run())
    try:
        yield r
    finally:
        stop.set()
        assert await asyncio.wait_for(running, 30) == 0


async def scenario(work: Path, moto: stand_in.Moto, found: dict[str, Any]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    lone, admin = found["lone"], list(found["keys"]["admin"])
    instances = {"n1": lone, "n2": found["members"][0], "n3": found["members"][1], "n4": ""}
    with control_plane(work) as cp:
        api = Api.from_kubeconfig(str(cp.kubeconfig), 10)
        try:
            c = Cluster(cp, api)
            await c.namespace(STACK)
            for name in NODES:
                obj = node_object(name)
                if instances[name]:
                    obj["spec"] = {"providerID": f"aws:///{stand_in.ZONE}/{instances[name]}"}
                await c.create("/api/v1/nodes", obj)
            kubeconfig = await c.token_kubeconfig(work)
            await c.fault("n1")
            async with controller(kubeconfig, moto.url) as r:
                assert isinstance(r.backend, AutoScalingBackend)

                async def failed() -> list[dict[str, Any]]:
                    return [e for e in await c.events() if e["reason"] == "ReplacementRequestFailed"]

                seen["failed"] = await until(failed, "the request failing: the instance is in no group")
                passes = r.passes
                await until(lambda: r.passes >= passes + 2, "two more passes")
                seen["while_failing"] = await c.node("n1")
                await asyncio.to_thread(moto.attach, lone, admin)
                seen["requested"] = await until(lambda: _phase(c, "n1", Phase.REQUESTED), "n1 marked for replacement")
                seen["events"] = await c.events()
                samples = {
                    result: r.metrics.registry.get_sample_value(REQUESTS, {"backend": "autoscaling", "result": result})
                    for result in ("done", "not_in_group")
                }
                seen["samples"] = samples
            seen["health"] = await asyncio.to_thread(moto.health, admin)
        finally:
            with contextlib.suppress(ApiError):
                await api.close()
    return seen


def test_node_recovery_marks_the_faulty_nodes_instance_unhealthy_in_its_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require(stand_in.missing(), "make setup", "moto's server mode, the AWS API stand-in")
    with stand_in.moto_server(free_port(), tmp_path) as moto:
        found = moto.setup(users={"remediator": IAM_POLICY, "admin": ADMIN})
        moto.enforce_auth()
        for name in ("AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                     "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_AUTO_SCALING", "AWS_SESSION_TOKEN"):  # fmt: skip
            monkeypatch.delenv(name, raising=False)
        key, secret = found["keys"]["remediator"]
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        seen = _run(scenario(tmp_path, moto, found))
    lone = found["lone"]
    (failed,) = seen["failed"]
    assert "not_in_group" in failed["message"], failed["message"]
    assert lone in failed["message"], failed["message"]
    assert failed["involvedObject"]["name"] == "n1"
    # told once, though asked at every pass, and the workflow waited in its drain for the request
    assert failed["count"] == 1
    while_failing = remediation.load(seen["while_failing"]["metadata"]["annotations"][remediation.STATE_ANNOTATION])
    assert while_failing.phase is Phase.DRAINING
    (requested,) = [e for e in seen["events"] if e["reason"] == "ReplacementRequested"]
    assert f"instance {lone} marked Unhealthy in Auto Scaling group {stand_in.GROUP}" in requested["message"]
    assert seen["health"] == {lone: "UNHEALTHY", **{m: "HEALTHY" for m in found["members"]}}
    assert seen["samples"]["done"] == 1
    assert (seen["samples"]["not_in_group"] or 0) >= 2
