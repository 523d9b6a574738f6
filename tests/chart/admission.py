"""What the API server answers a list of attempted writes: "allowed", or the refusal's status and
message; for the admission-policy tests, which each try what an agent may and may not do."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any

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
