"""Every permission the controller needs, and why: the chart's ClusterRole and Role render these, the
integration test runs the controller under exactly them, and docs/remediation.md shows the table
(`markdown_table`; a test keeps the page equal to it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    group: str  # "" is the core group
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str
    names: tuple[str, ...] = ()  # resourceNames; () is any

    def as_object(self) -> dict[str, list[str]]:
        rule = {"apiGroups": [self.group], "resources": list(self.resources), "verbs": list(self.verbs)}
        if self.names:
            rule["resourceNames"] = list(self.names)
        return rule


# A ClusterRole: Nodes, and pods in every namespace.
CLUSTER_RULES: tuple[Rule, ...] = (
    Rule("", ("nodes",), ("list", "watch"), "the fleet view: conditions, cordons, labels and the workflow annotations"),
    Rule(
        "",
        ("nodes",),
        ("patch",),
        "cordon and uncordon, the controller's taint, and its annotations (the workflow state, the request); "
        "each patch carries the resourceVersion it decided on",
    ),
    Rule("", ("pods",), ("list", "watch"), "the pods bound to each node, which a drain moves"),
    Rule(
        "",
        ("pods/eviction",),
        ("create",),
        "evict through the Eviction API (a policy/v1 Eviction posted to the pod's subresource), which honours "
        "PodDisruptionBudgets",
    ),
    Rule(
        "",
        ("pods",),
        ("delete",),
        "delete a pod without a controller (as `kubectl drain --force`), or one past its namespace's "
        "delete-after timeout",
    ),
    Rule(
        "resource.k8s.io",
        ("resourceclaims",),
        ("get",),
        "with --drain-pods=neuron: whether a pod's ResourceClaim is allocated by the Neuron DRA driver",
    ),
    Rule(
        "",
        ("events",),
        ("create", "get", "patch"),
        "an Event per step, on the Node and on each pod moved; the same news again counts on the Event already there",
    ),
)

# A Role in the controller's own namespace, for leader election (--leader-elect). `create` cannot be
# held to a name (the name is in the body, not the URL), so it is a rule of its own.
LEASE_RULES: tuple[Rule, ...] = (
    Rule("coordination.k8s.io", ("leases",), ("create",), "create the Lease the replicas elect on, the first time"),
    Rule(
        "coordination.k8s.io",
        ("leases",),
        ("get", "update"),
        "take, renew and release the Lease (named by --lease-name)",
        names=("neuron-remediation",),
    ),
)

# With --metrics-auth=kubernetes only (as every service of the chart): a ClusterRole of its own.
METRICS_AUTH_RULES: tuple[Rule, ...] = (
    Rule("authentication.k8s.io", ("tokenreviews",), ("create",), "--metrics-auth=kubernetes: who calls /metrics"),
    Rule(
        "authorization.k8s.io",
        ("subjectaccessreviews",),
        ("create",),
        "--metrics-auth=kubernetes: whether that caller may get /metrics",
    ),
)


def markdown_table() -> str:
    rows = ["| Where | API group | Resource | Verbs | Why |", "|---|---|---|---|---|"]
    for where, rules in (
        ("ClusterRole", CLUSTER_RULES),
        ("Role (its namespace)", LEASE_RULES),
        ("ClusterRole, with `--metrics-auth=kubernetes`", METRICS_AUTH_RULES),
    ):
        for r in rules:
            names = f" (`{', '.join(r.names)}` only)" if r.names else ""
            resources = ", ".join(f"`{x}`" for x in r.resources)
            group = f"`{r.group}`" if r.group else "core"
            rows.append(f"| {where} | {group} | {resources}{names} | {', '.join(r.verbs)} | {r.why} |")
    return "\n".join(rows)
