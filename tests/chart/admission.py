"""What the API server answers a list of attempted writes: "allowed", or the refusal's status and
message; for the admission-policy tests, which each try what an agent may and may not do."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from polling import until_async

from neuron_common.kube import ApiError

# where the admin creates the chart's RBAC and admission policies, by kind
PATHS = {
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "ValidatingAdmissionPolicy": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
}


async def outcomes(attempts: Mapping[str, Awaitable[Any]]) -> dict[str, str]:
    answers: dict[str, str] = {}
    for name, call in attempts.items():
        try:
            await call
            answers[name] = "allowed"
        except ApiError as exc:
            answers[name] = f"{exc.status} {exc.message}"
    return answers


async def until_enforced(attempt: Callable[[], Awaitable[Any]], refusal: str, status: int = 403) -> None:
    """Repeats `attempt` until the API server refuses it (`status`: 403 for a validation's reason
    Forbidden, 422 for Invalid) with `refusal` in its message: a new admission policy takes a moment
    to be enforced after it is created."""

    async def refused() -> bool:
        try:
            await attempt()
        except ApiError as exc:
            if exc.status == status and refusal in exc.message:
                return True
            raise  # not yet: the wait names the last answer
        return False

    await until_async(refused, f"the admission policy to refuse with {refusal!r}", 10.0, 0.05, ignore=(ApiError,))
