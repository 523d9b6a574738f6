"""The Auto Scaling backend (`--replacement-backend=autoscaling`, AWS's npd.nodeRecovery.enabled).

Unit: Signature Version 4 against AWS's own published example, the instance and region of a
providerID, and the failures that need no AWS (no providerID, no credentials, nothing listening).
Integration: against moto's server mode (tests/standins/aws.py), with moto checking the signature
and the IAM policy as AWS does, under exactly replacement.IAM_POLICY: the node's instance turns
Unhealthy in its group as AWS's SDK reads it back, and the errors are the ones AWS gives.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from simcluster.controlplane import free_port
from skips import require
from standins import aws as stand_in

from neuron_model.remediation import Phase, WorkflowState
from neuron_remediation import aws, config
from neuron_remediation.fleet import NodeView, node_view
from neuron_remediation.replacement import IAM_POLICY, AutoScalingBackend, BackendError, NoBackend, Result, make

REPLACE = WorkflowState("HBM_UNCORRECTABLE_ERROR", "NeuronHasError_HBM_UNCORRECTABLE_ERROR", "replace", "b",
                        Phase.DRAINING, 1.0, 1.0, True)  # fmt: skip
REBOOT = WorkflowState("UNHEALTHY_LINK_HOST", "NeuronHasError_UNHEALTHY_LINK_HOST", "reboot", "b",
                       Phase.DRAINING, 1.0, 1.0, True)  # fmt: skip
KEYS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret"}


def node(instance: str = "i-0123456789abcdef0", zone: str = stand_in.ZONE) -> NodeView:
    return NodeView("n1", provider_id=f"aws:///{zone}/{instance}")


# -- unit ------------------------------------------------------------------------------------------
def test_the_signature_is_the_one_of_awss_published_example() -> None:
    # AWS's "Signature Version 4 signing process" example: IAM ListUsers, 2015-08-30T12:36:00Z
    credentials = aws.Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    headers = aws.sign(
        "GET", "https://iam.amazonaws.com/?Action=ListUsers&Version=2010-05-08",
        {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}, b"", credentials, "us-east-1", "iam",
        dt.datetime(2015, 8, 30, 12, 36, 0),
    )  # fmt: skip
    assert headers["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, "
        "SignedHeaders=content-type;host;x-amz-date, "
        "Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
    )
    assert aws.signing_key(credentials.secret_key, "20150830", "us-east-1", "iam").hex() == (
        "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9"
    )
    token = aws.sign("POST", "https://x/", {}, b"", aws.Credentials("a", "b", "tok"), "r", "s", dt.datetime(2020, 1, 1))
    assert token["X-Amz-Security-Token"] == "tok"
    assert "x-amz-security-token" in token["Authorization"]


@pytest.mark.parametrize(
    ("provider_id", "instance", "region"),
    [
        ("aws:///us-west-2a/i-0123456789abcdef0", "i-0123456789abcdef0", "us-west-2"),
        ("aws:///us-west-2-lax-1a/i-0abc", "i-0abc", "us-west-2"),
        ("aws:///us-gov-west-1b/i-0abc", "i-0abc", "us-gov-west-1"),
        ("aws:///cn-north-1a/i-0abc", "i-0abc", "cn-north-1"),
        ("aws://us-east-1c/i-0abc", None, None),
        ("kind://docker/cluster/node", None, None),
        ("", None, None),
    ],
)
def test_the_instance_and_region_of_a_provider_id(provider_id: str, instance: str | None, region: str | None) -> None:
    found = aws.instance_of(provider_id)
    assert (found.id if found else None, found.region if found else None) == (instance, region)


def test_the_node_view_carries_the_provider_id() -> None:
    view = node_view({"metadata": {"name": "n"}, "spec": {"providerID": "aws:///us-west-2a/i-0abc"}}, "aws.amazon.com")
    assert view is not None
    assert view.provider_id == "aws:///us-west-2a/i-0abc"


def test_the_region_is_the_flags_then_the_zones_then_the_environments() -> None:
    instance = aws.Instance("i-0abc", "eu-west-1b")
    assert AutoScalingBackend(region="us-east-1", environ={}).region_for(instance) == "us-east-1"
    assert AutoScalingBackend(environ={"AWS_REGION": "us-east-2"}).region_for(instance) == "eu-west-1"
    assert AutoScalingBackend(environ={"AWS_REGION": "us-east-2"}).region_for(aws.Instance("i-0", "")) == "us-east-2"
    assert AutoScalingBackend(environ={}).endpoint_for("eu-west-1") == "https://autoscaling.eu-west-1.amazonaws.com"
    assert (
        AutoScalingBackend(environ={"AWS_ENDPOINT_URL_AUTO_SCALING": "https://vpce"}).endpoint_for("x")
        == "https://vpce"
    )


async def _failure(backend: AutoScalingBackend, view: NodeView, state: WorkflowState = REPLACE) -> BackendError:
    try:
        with pytest.raises(BackendError) as caught:
            await backend.request(view, state)
        return caught.value
    finally:
        await backend.close()


async def test_a_node_without_an_aws_provider_id_is_a_clear_error() -> None:
    error = await _failure(AutoScalingBackend(environ=KEYS), NodeView("n1", provider_id="kind://docker/n1"))
    assert error.result is Result.NO_INSTANCE
    assert "kind://docker/n1" in str(error)
    error = await _failure(AutoScalingBackend(environ=KEYS), NodeView("n1"))
    assert error.result is Result.NO_INSTANCE


async def test_no_credentials_is_a_clear_error() -> None:
    error = await _failure(AutoScalingBackend(environ={}), node())
    assert error.result is Result.NO_CREDENTIALS
    assert "eks.amazonaws.com/role-arn" in str(error)


async def test_an_endpoint_that_does_not_answer_is_unreachable_not_a_crash() -> None:
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    error = await _failure(AutoScalingBackend(endpoint=down, environ=KEYS, timeout=2), node())
    assert error.result is Result.UNREACHABLE
    assert down in str(error)


async def test_the_reboot_rung_is_left_alone_unless_asked() -> None:
    backend = AutoScalingBackend(endpoint=f"http://127.0.0.1:{free_port()}", environ=KEYS, timeout=2)
    outcome = await backend.request(node(), REBOOT)
    assert outcome.result == Result.SKIPPED
    backend.reboot = True  # now it asks, and so reaches the endpoint (down)
    assert (await _failure(backend, node(), REBOOT)).result is Result.UNREACHABLE


async def test_eks_pod_identitys_credentials_are_read_with_the_token_of_its_file(tmp_path: Path) -> None:
    """The Pod Identity agent's protocol (as ECS's container credentials): a GET with the token file's
    content as Authorization, JSON back. Here a real HTTP server that answers as the agent does."""
    from aiohttp import web

    token = tmp_path / "eks-pod-identity-token"
    token.write_text("the-token\n")
    seen: list[str] = []

    async def credentials(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        if request.headers.get("Authorization") != "the-token":
            return web.json_response({"code": "AccessDenied"}, status=403)
        return web.json_response({
            "AccessKeyId": "ASIAEXAMPLE", "SecretAccessKey": "s", "Token": "session",
            "Expiration": "2099-01-01T00:00:00Z",
        })  # fmt: skip

    app = web.Application()
    app.router.add_get("/v1/credentials", credentials)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        url = f"http://127.0.0.1:{port}/v1/credentials"
        environ = {"AWS_CONTAINER_CREDENTIALS_FULL_URI": url, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(token)}
        b = AutoScalingBackend(environ=environ)
        try:
            got = await b.chain.get("us-west-2")
            assert (got.access_key, got.secret_key, got.token) == ("ASIAEXAMPLE", "s", "session")
            assert got.expires == dt.datetime(2099, 1, 1, tzinfo=dt.UTC).timestamp()
            assert await b.chain.get("us-west-2") is got  # cached until shortly before it expires
            assert seen == ["the-token"]
            token.write_text("a-rotated-token")
            b.chain.cached = None
            with pytest.raises(aws.AwsError, match="403"):
                await b.chain.get("us-west-2")  # the file is read again at each fetch
        finally:
            await b.close()
    finally:
        await runner.cleanup()


def test_the_flags_choose_the_backend() -> None:
    assert isinstance(make(config.parse([], env={})), NoBackend)
    argv = ["--replacement-backend=autoscaling", "--aws-region=us-west-2", "--autoscaling-endpoint=http://e",
            "--respect-grace-period", "--autoscaling-reboot"]  # fmt: skip
    backend = make(config.parse(argv, env={}))
    assert isinstance(backend, AutoScalingBackend)
    assert (backend.region, backend.endpoint, backend.respect_grace_period, backend.reboot) == (
        "us-west-2", "http://e", True, True,
    )  # fmt: skip
    env = {"NEURON_REMEDIATION_REPLACEMENT_BACKEND": "autoscaling"}
    assert isinstance(make(config.parse([], env=env)), AutoScalingBackend)


# -- against moto ------------------------------------------------------------------------------------
NO_SET = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": ["autoscaling:DescribeAutoScalingInstances"], "Resource": "*"}],
}
ADMIN = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[stand_in.Moto, dict[str, Any]]]:
    require(stand_in.missing(), "make setup", "moto's server mode, the AWS API stand-in")
    with stand_in.moto_server(free_port(), tmp_path_factory.mktemp("moto")) as server:
        users = {"remediator": IAM_POLICY, "describe-only": NO_SET, "admin": ADMIN}
        found = server.setup(users=users, roles={"remediator-role": IAM_POLICY})
        server.enforce_auth()
        yield server, found


@pytest.fixture(scope="module")
def moto_open(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[stand_in.Moto, dict[str, Any]]]:
    """Without moto's auth checks: they want every request signed, and AssumeRoleWithWebIdentity is not
    (the token is its proof), so moto cannot check IRSA's exchange."""
    require(stand_in.missing(), "make setup", "moto's server mode, the AWS API stand-in")
    with stand_in.moto_server(free_port(), tmp_path_factory.mktemp("moto-open")) as server:
        yield server, server.setup(roles={"remediator-role": IAM_POLICY})


def keys(found: dict[str, Any], user: str) -> dict[str, str]:
    key, secret = found["keys"][user]
    return {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}


def backend(server: stand_in.Moto, environ: dict[str, str], **kw: Any) -> AutoScalingBackend:
    return AutoScalingBackend(endpoint=server.url, environ=environ, **kw)


@pytest.mark.integration
async def test_the_nodes_instance_turns_unhealthy_under_the_documented_policy(
    moto: tuple[stand_in.Moto, dict[str, Any]],
) -> None:
    server, found = moto
    first, second = found["members"]
    admin = list(found["keys"]["admin"])
    assert server.health(admin) == {first: "HEALTHY", second: "HEALTHY"}
    b = backend(server, keys(found, "remediator"))
    try:
        outcome = await b.request(node(first), REPLACE)
        assert outcome.result == Result.DONE
        assert stand_in.GROUP in outcome.message
        assert first in outcome.message
        assert server.health(admin) == {first: "UNHEALTHY", second: "HEALTHY"}
        again = await b.request(node(first), REPLACE)  # a retry after a lost patch asks nothing twice
        assert again.result == Result.ALREADY
    finally:
        await b.close()


@pytest.mark.integration
async def test_irsas_web_identity_is_exchanged_at_sts(
    moto_open: tuple[stand_in.Moto, dict[str, Any]], tmp_path: Path
) -> None:
    server, found = moto_open
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.e30.c2lnbmF0dXJl")
    environ = {"AWS_ROLE_ARN": found["keys"]["remediator-role"], "AWS_WEB_IDENTITY_TOKEN_FILE": str(token)}
    b = AutoScalingBackend(endpoint=server.url, sts_endpoint=server.url, environ=environ)
    try:
        outcome = await b.request(node(found["members"][1]), REPLACE)
        assert outcome.result == Result.DONE
        assert b.chain.cached is not None
        assert b.chain.cached.token
        assert b.chain.cached.expires is not None
    finally:
        await b.close()
    assert server.health(["testing", "testing"])[found["members"][1]] == "UNHEALTHY"


@pytest.mark.integration
async def test_an_instance_in_no_group_is_a_clear_error_until_it_joins_one(
    moto: tuple[stand_in.Moto, dict[str, Any]],
) -> None:
    server, found = moto
    lone, admin = found["lone"], list(found["keys"]["admin"])
    b = backend(server, keys(found, "remediator"))
    try:
        error = await _failure_open(b, node(lone))
        assert error.result is Result.NOT_IN_GROUP
        assert lone in str(error)
        server.attach(lone, admin)  # the next pass asks again, and now it is done
        assert (await b.request(node(lone), REPLACE)).result == Result.DONE
    finally:
        await b.close()
    assert server.health(admin)[lone] == "UNHEALTHY"


@pytest.mark.integration
async def test_moto_holds_the_policy_and_the_signature_as_aws_does(moto: tuple[stand_in.Moto, dict[str, Any]]) -> None:
    server, found = moto
    first = found["members"][1]  # the one the other tests leave Healthy: SetInstanceHealth is called on it
    denied = await _failure(backend(server, keys(found, "describe-only")), node(first))
    assert denied.result is Result.REFUSED
    assert "AccessDenied" in str(denied)
    assert "SetInstanceHealth" in str(denied)
    forged = {**keys(found, "remediator"), "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    unsigned = await _failure(backend(server, forged), node(first))
    assert unsigned.result is Result.REFUSED
    assert "SignatureDoesNotMatch" in str(unsigned)
    assert server.health(list(found["keys"]["admin"]))[first] == "HEALTHY"


@pytest.mark.integration
async def test_https_is_verified_against_certifi_or_aws_ca_bundle(tmp_path: Path) -> None:
    """The images have no system CA store: a certificate no CA of certifi's signed is refused, and one
    AWS_CA_BUNDLE names is trusted, as the AWS SDKs do."""
    require(stand_in.missing(), "make setup", "moto's server mode, the AWS API stand-in")
    tls = stand_in.self_signed(tmp_path)
    with stand_in.moto_server(free_port(), tmp_path, tls) as server:
        found = await asyncio.to_thread(server.setup)
        assert server.url.startswith("https://")
        refused = await _failure(backend(server, KEYS), node(found["members"][0]))
        assert refused.result is Result.UNREACHABLE
        assert "certificate verify failed" in str(refused)
        trusting = backend(server, {**KEYS, "AWS_CA_BUNDLE": str(tls[0])})
        try:
            assert (await trusting.request(node(found["members"][0]), REPLACE)).result == Result.DONE
        finally:
            await trusting.close()


async def _failure_open(b: AutoScalingBackend, view: NodeView) -> BackendError:
    with pytest.raises(BackendError) as caught:
        await b.request(view, REPLACE)
    return caught.value


def test_the_policy_is_least_privilege() -> None:
    actions = sorted(a for s in IAM_POLICY["Statement"] for a in s["Action"])
    assert actions == ["autoscaling:DescribeAutoScalingInstances", "autoscaling:SetInstanceHealth"]
    assert json.loads(json.dumps(IAM_POLICY)) == IAM_POLICY
