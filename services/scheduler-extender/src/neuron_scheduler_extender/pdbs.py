"""PodDisruptionBudgets as kube-scheduler's preemption reads them. Pure.

kube-scheduler's dry run prefers victims whose eviction keeps every budget
(framework/plugins/defaultpreemption/default_preemption.go `filterPodsWithPDBViolation`): for each
potential victim, the most important first, each budget of its namespace whose selector matches its
labels, and that does not list it among `status.disruptedPods` already, loses one of its
`status.disruptionsAllowed`; a victim that takes a budget below zero violates it. A budget with a
nil or empty selector matches nothing there. The same rule, on the same order, marks the candidates
`preemption.choose` sorts its victim sets by.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist
    values: frozenset[str]


@dataclass(frozen=True, slots=True)
class Budget:
    key: str  # namespace/name
    namespace: str
    match_labels: tuple[tuple[str, str], ...]
    expressions: tuple[Requirement, ...]
    disruptions_allowed: int
    disrupted: frozenset[str]  # pod names the disruption controller counts as disrupted already
    valid: bool = True  # False: a selector kube-scheduler could not parse, which it skips

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        if not self.valid or self.empty:
            return False
        if any(labels.get(k) != v for k, v in self.match_labels):
            return False
        for r in self.expressions:
            present = r.key in labels
            if r.operator == "In" and not (present and labels[r.key] in r.values):
                return False
            if r.operator == "NotIn" and present and labels[r.key] in r.values:
                return False
            if r.operator == "Exists" and not present:
                return False
            if r.operator == "DoesNotExist" and present:
                return False
        return True


OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


def budget(obj: Mapping[str, Any]) -> Budget | None:
    """What the view keeps of a policy/v1 PodDisruptionBudget; None for one without a name."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return None
    namespace = meta.get("namespace") or "default"
    spec, status = obj.get("spec"), obj.get("status")
    selector = spec.get("selector") if isinstance(spec, Mapping) else None
    status = status if isinstance(status, Mapping) else {}
    allowed = status.get("disruptionsAllowed", 0)
    disrupted = status.get("disruptedPods")
    key, allowed_ = f"{namespace}/{meta['name']}", allowed if isinstance(allowed, int) else 0
    gone = frozenset(disrupted) if isinstance(disrupted, Mapping) else frozenset()
    labels = selector.get("matchLabels") if isinstance(selector, Mapping) else None
    expressions = selector.get("matchExpressions") if isinstance(selector, Mapping) else None
    try:
        match = tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items()))
        reqs = tuple(
            Requirement(str(e["key"]), str(e["operator"]), frozenset(map(str, e.get("values") or ())))
            for e in (expressions or ())
        )
    except (AttributeError, KeyError, TypeError):
        return Budget(key, namespace, (), (), allowed_, gone, valid=False)
    valid = all(r.operator in OPERATORS and (bool(r.values) == (r.operator in ("In", "NotIn"))) for r in reqs)
    return Budget(key, namespace, match, reqs, allowed_, gone, valid=valid)


@dataclass(frozen=True, slots=True)
class Subject:
    uid: str
    name: str
    namespace: str
    labels: Mapping[str, str]


def violating(pods: Sequence[Subject], budgets: Iterable[Budget]) -> frozenset[str]:
    """The uids of `pods` (the most important first) whose eviction, after those before them, takes a
    budget below its minimum: kube-scheduler's `filterPodsWithPDBViolation`."""
    budgets = list(budgets)
    allowed = {b.key: b.disruptions_allowed for b in budgets}
    by_namespace: dict[str, list[Budget]] = {}
    for b in budgets:
        by_namespace.setdefault(b.namespace, []).append(b)
    found = set()
    for pod in pods:
        if not pod.labels:
            continue
        for b in by_namespace.get(pod.namespace, ()):
            if not b.matches(pod.labels) or pod.name in b.disrupted:
                continue
            allowed[b.key] -= 1
            if allowed[b.key] < 0:
                found.add(pod.uid)
    return frozenset(found)
