"""How a drained node's reboot or new instance is asked for, beyond the Node itself.

The Node already asks: the problem detector's `AcceleratedHardwareReady=False` (EKS node auto repair
and Karpenter's node repair act on it) and, by default, the controller's request annotation
(`remediation.REQUEST_ANNOTATION`), which an external remediation system watches. A `Backend` is a
further step the controller takes before it writes that patch (`--replacement-backend`):
- `NoBackend` (`none`, the default): the Node's condition and annotation are the whole request;
- `AutoScalingBackend` (`autoscaling`, AWS's `npd.nodeRecovery.enabled`): AWS Auto Scaling's
  `SetInstanceHealth` marks the node's instance Unhealthy, and its group replaces it. The `replace`
  rung only, unless `--autoscaling-reboot`: a new instance is not a reboot, and nothing in AWS's
  Auto Scaling API reboots one.
"""

from __future__ import annotations

import enum
import logging
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
import certifi

from neuron_health.faults import Rung
from neuron_model.remediation import WorkflowState
from neuron_remediation import aws
from neuron_remediation.fleet import NodeView

if TYPE_CHECKING:
    from neuron_remediation.config import Config

log = logging.getLogger(__name__)

# The least privilege of the autoscaling backend (docs/remediation.md and docs/security.md show it; the
# tests run the backend under exactly this policy in moto, which enforces it). A Condition on the
# group's tag (autoscaling:ResourceTag/...) narrows SetInstanceHealth further where the groups carry
# one; DescribeAutoScalingInstances takes no resource-level permission.
IAM_POLICY: Mapping[str, Any] = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Sid": "FindTheNodesGroup",
            "Effect": "Allow",
            "Action": ["autoscaling:DescribeAutoScalingInstances"],
            "Resource": "*",
        },
        {
            "Sid": "MarkTheNodeUnhealthy",
            "Effect": "Allow",
            "Action": ["autoscaling:SetInstanceHealth"],
            "Resource": "*",
        },
    ],
}


class Result(enum.StrEnum):
    """`neuron_remediation_replacement_requests_total{result}`."""

    DONE = "done"  # marked Unhealthy
    ALREADY = "already"  # the group had it Unhealthy already
    SKIPPED = "skipped"  # not this backend's rung
    NO_INSTANCE = "no_instance"  # no aws:/// providerID, or no region to ask in
    NOT_IN_GROUP = "not_in_group"  # the instance is in no Auto Scaling group
    NO_CREDENTIALS = "no_credentials"
    REFUSED = "refused"  # AWS answered with an error (AccessDenied, Throttling, ...)
    UNREACHABLE = "unreachable"  # no answer from the endpoint
    FAILED = "failed"  # anything else a backend raised


@dataclass(frozen=True)
class Outcome:
    result: str  # a Result, or "" where there is nothing to count (NoBackend)
    message: str  # a sentence for the Event, or ""


class BackendError(Exception):
    """The request was not made; the controller asks again at the next pass."""

    def __init__(self, result: Result, message: str) -> None:
        super().__init__(message)
        self.result = result


class Backend(Protocol):
    name: str

    async def request(self, node: NodeView, state: WorkflowState) -> Outcome:
        """Ask for the node's reboot or new instance (state.rung). Raise (a BackendError says why) to
        have the request asked again at the next pass: the workflow stays until it succeeds."""
        ...

    async def close(self) -> None: ...


class NoBackend:
    """The Node's condition and annotation are the whole request."""

    name = "none"

    async def request(self, node: NodeView, state: WorkflowState) -> Outcome:
        return Outcome("", "")

    async def close(self) -> None:
        return None


class AutoScalingBackend:
    """`SetInstanceHealth(HealthStatus=Unhealthy)` on the node's instance, found in its group first
    (DescribeAutoScalingInstances: an instance in no group is said so, not guessed at)."""

    name = "autoscaling"

    def __init__(
        self,
        *,
        region: str = "",
        endpoint: str = "",
        sts_endpoint: str = "",
        respect_grace_period: bool = False,
        reboot: bool = False,
        timeout: float = 10.0,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.environ = dict(os.environ if environ is None else environ)
        self.region, self.endpoint = region, endpoint
        self.sts_endpoint = sts_endpoint
        self.respect_grace_period, self.reboot = respect_grace_period, reboot
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._chain: aws.CredentialChain | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:  # made in the running loop, on first use
            # the images are FROM scratch, with no system CA store: certifi's bundle, or AWS_CA_BUNDLE as the
            # SDKs read it (a proxy's CA)
            context = ssl.create_default_context(cafile=self.environ.get("AWS_CA_BUNDLE") or certifi.where())
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout), connector=aiohttp.TCPConnector(ssl=context)
            )
        return self._session

    @property
    def chain(self) -> aws.CredentialChain:
        if self._chain is None:
            self._chain = aws.CredentialChain(self.environ, self.session, self.sts_endpoint)
        return self._chain

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def region_for(self, instance: aws.Instance) -> str:
        """The flag's, else the node's own zone's, else the pod's environment's (the SDKs' AWS_REGION)."""
        return (
            self.region
            or instance.region
            or self.environ.get("AWS_REGION")
            or self.environ.get("AWS_DEFAULT_REGION", "")
        )

    def endpoint_for(self, region: str) -> str:
        e = self.environ
        return (
            self.endpoint
            or e.get("AWS_ENDPOINT_URL_AUTO_SCALING")
            or e.get("AWS_ENDPOINT_URL")
            or aws.default_endpoint("autoscaling", region)
        )

    async def request(self, node: NodeView, state: WorkflowState) -> Outcome:
        if state.rung != str(Rung.REPLACE) and not self.reboot:
            return Outcome(
                Result.SKIPPED,
                f"the {state.rung} rung is not marked Unhealthy in Auto Scaling (--autoscaling-reboot would "
                "replace the instance instead)",
            )
        instance = aws.instance_of(node.provider_id)
        if instance is None:
            raise BackendError(
                Result.NO_INSTANCE,
                f"the Node's spec.providerID {node.provider_id!r} names no EC2 instance (aws:///<zone>/i-...)",
            )
        region = self.region_for(instance)
        if not region:
            raise BackendError(
                Result.NO_INSTANCE, f"no region for instance {instance.id}: set --aws-region or AWS_REGION"
            )
        try:
            credentials = await self.chain.get(region)
        except aws.Unreachable as exc:
            raise BackendError(Result.UNREACHABLE, f"AWS credentials: {exc}") from None
        except aws.AwsError as exc:
            result = Result.NO_CREDENTIALS if exc.code == "NoCredentials" else Result.REFUSED
            raise BackendError(result, f"AWS credentials ({self.chain.source() or 'none'}): {exc}") from None
        endpoint = self.endpoint_for(region)
        try:
            group, health = await self._describe(endpoint, region, credentials, instance.id)
            if health.upper() == "UNHEALTHY":
                return Outcome(
                    Result.ALREADY, f"instance {instance.id} is already Unhealthy in Auto Scaling group {group}"
                )
            await aws.call(
                self.session, endpoint, "autoscaling", region, credentials,
                {
                    "Action": "SetInstanceHealth",
                    "Version": "2011-01-01",
                    "InstanceId": instance.id,
                    "HealthStatus": "Unhealthy",
                    "ShouldRespectGracePeriod": "true" if self.respect_grace_period else "false",
                },
            )  # fmt: skip
        except aws.Unreachable as exc:
            raise BackendError(Result.UNREACHABLE, f"Auto Scaling at {endpoint}: {exc}") from None
        except aws.AwsError as exc:
            if credentials.expires is not None:
                self.chain.cached = None  # expired or revoked temporary keys: fetched again at the next pass
            raise BackendError(Result.REFUSED, f"Auto Scaling refused instance {instance.id}: {exc}") from None
        grace = "respecting" if self.respect_grace_period else "ignoring"
        return Outcome(
            Result.DONE,
            f"instance {instance.id} marked Unhealthy in Auto Scaling group {group} (SetInstanceHealth, {grace} "
            "the group's health check grace period): the group replaces it",
        )

    async def _describe(
        self, endpoint: str, region: str, credentials: aws.Credentials, instance_id: str
    ) -> tuple[str, str]:
        """(its group, its health status) or BackendError(NOT_IN_GROUP)."""
        root = await aws.call(
            self.session, endpoint, "autoscaling", region, credentials,
            {"Action": "DescribeAutoScalingInstances", "Version": "2011-01-01", "InstanceIds.member.1": instance_id},
        )  # fmt: skip
        for member in aws.members(root, "AutoScalingInstances"):
            if aws.text(member, "InstanceId") == instance_id:
                return aws.text(member, "AutoScalingGroupName"), aws.text(member, "HealthStatus")
        raise BackendError(
            Result.NOT_IN_GROUP,
            f"instance {instance_id} is in no Auto Scaling group in {region}: nothing replaces it through "
            "SetInstanceHealth (a node of Karpenter or a standalone instance: use --replacement-backend=none, on "
            "which AcceleratedHardwareReady=False asks)",
        )


def make(config: Config) -> Backend:
    """The backend `--replacement-backend` names."""
    if config.replacement_backend == "autoscaling":
        return AutoScalingBackend(
            region=config.aws_region,
            endpoint=config.autoscaling_endpoint,
            sts_endpoint=config.sts_endpoint,
            respect_grace_period=config.respect_grace_period,
            reboot=config.autoscaling_reboot,
            timeout=config.api_timeout,
        )
    return NoBackend()
