"""Move a cluster from a release of AWS's neuron-helm-chart to this chart without a node going
without its Neuron resources for longer than one device-plugin restart, and without touching a
running pod's devices.

    aws_handover.py --from-release NAME [--from-namespace NS] --release NAME [--namespace NS]
                    [--chart PATH] [--dry-run] [-- HELM_ARGS...]

Why a tool and not `helm upgrade` alone: Helm can adopt an existing object only when its ownership
annotations name the release, and a DaemonSet's selector is immutable, while AWS's device plugin
selects its pods by `name: neuron-device-plugin-ds` and this chart by its `app.kubernetes.io/*`
labels. A plain `helm upgrade` of AWS's release therefore fails on the device plugin ("field is
immutable"), and a delete-then-install leaves every node without the plugin for as long as the new
image takes to pull and start. The handover instead:

1. reads both releases' objects (`helm get manifest` of AWS's, `helm template` of this chart's);
2. deletes AWS's DaemonSets with `--cascade=orphan`: their pods keep running and advertising;
3. where this chart has a DaemonSet of the same name and namespace (the default: both name the
   device plugin `neuron-device-plugin` in `kube-system`), relabels the orphaned pods to its
   selector, so the new DaemonSet adopts them and replaces them node by node as a rolling update
   (one plugin restart per node, `maxUnavailable` at a time);
4. hands every other object both releases name to the new release (Helm's ownership annotations),
   so Helm adopts it instead of refusing it;
5. forgets AWS's release when the new one has another name or namespace (its Helm records only:
   `helm uninstall` would delete what was just adopted);
6. runs `helm upgrade --install --wait` of this chart;
7. deletes what is left of AWS's release: objects this chart does not have, and orphaned pods no
   new DaemonSet adopted (those only after the new DaemonSets are ready, so the node is never
   without a plugin).

Running pods keep their devices throughout: the kubelet's checkpoint holds their allocations, and
no step touches a workload. `--dry-run` prints the plan and changes nothing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "neuron-helm-chart"
# Objects without a namespace; every other kind lives in one (the release's unless it names another).
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "DeviceClass",
    "MutatingWebhookConfiguration",
    "Namespace",
    "PriorityClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ValidatingWebhookConfiguration",
}
WORKLOADS = {"DaemonSet", "Deployment"}


@dataclass(frozen=True, order=True)
class Ref:
    kind: str
    name: str
    namespace: str  # "" for a cluster-scoped object

    def args(self) -> list[str]:
        return [self.kind, self.name, *(["-n", self.namespace] if self.namespace else [])]

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace + '/' if self.namespace else ''}{self.name}"


@dataclass
class Rendered:
    """One release's objects, and the pod selector of each of its DaemonSets."""

    refs: set[Ref] = field(default_factory=set)
    selectors: dict[Ref, dict[str, str]] = field(default_factory=dict)


def parse_manifest(text: str, release_namespace: str) -> Rendered:
    out = Rendered()
    for doc in yaml.safe_load_all(text):
        if not isinstance(doc, dict) or "kind" not in doc:
            continue
        meta = doc.get("metadata") or {}
        if "helm.sh/hook" in (meta.get("annotations") or {}):
            continue  # hooks (helm test pods) are not the release's objects
        kind = doc["kind"]
        namespace = "" if kind in CLUSTER_SCOPED else (meta.get("namespace") or release_namespace)
        ref = Ref(kind, meta["name"], namespace)
        out.refs.add(ref)
        if kind == "DaemonSet":
            out.selectors[ref] = dict(doc["spec"]["selector"].get("matchLabels") or {})
    return out


@dataclass(frozen=True)
class Plan:
    orphan: list[Ref]  # AWS's workloads, deleted with their pods left running
    relabel: dict[Ref, tuple[dict[str, str], dict[str, str]]]  # old DaemonSet -> (old selector, new selector)
    delete_now: list[Ref]  # AWS's Deployments the new release replaces (not on the device path)
    adopt: list[Ref]  # objects both releases name, handed to the new release
    delete_after: list[Ref]  # AWS's objects this chart does not have
    forget_old_release: bool


def plan(old: Rendered, new: Rendered, *, same_release: bool) -> Plan:
    shared = old.refs & new.refs
    daemonsets = sorted(r for r in old.refs if r.kind == "DaemonSet")
    relabel = {r: (old.selectors[r], new.selectors[r]) for r in daemonsets if r in new.selectors}
    delete_now = sorted(r for r in shared if r.kind == "Deployment")
    return Plan(
        orphan=daemonsets,
        relabel=relabel,
        delete_now=delete_now,
        adopt=sorted(r for r in shared if r.kind not in WORKLOADS),
        delete_after=sorted(r for r in old.refs - new.refs if r.kind != "DaemonSet"),
        forget_old_release=not same_release,
    )


def describe(p: Plan, release: str, namespace: str) -> Iterable[str]:
    for r in p.orphan:
        yield f"delete {r} with --cascade=orphan (its pods keep serving)"
        if r in p.relabel:
            labels = ",".join(f"{k}={v}" for k, v in sorted(p.relabel[r][1].items()))
            yield f"  relabel its pods {labels}: the new DaemonSet adopts and rolls them node by node"
        else:
            yield "  its pods are deleted once the new DaemonSets are ready"
    for r in p.delete_now:
        yield f"delete {r} (the new release creates it again)"
    for r in p.adopt:
        yield f"hand {r} to release {namespace}/{release}"
    if p.forget_old_release:
        yield "forget the old release (its Helm records only)"
    yield f"helm upgrade --install {release} -n {namespace} --wait"
    for r in p.delete_after:
        yield f"delete {r} (not in this chart)"


def run(*args: str, check: bool = True, stdin: str | None = None) -> str:
    try:
        done = subprocess.run(args, check=False, input=stdin, capture_output=True, text=True)
    except FileNotFoundError:
        raise SystemExit(f"aws_handover: {args[0]} is not on PATH (the handover runs helm and kubectl)") from None
    if check and done.returncode != 0:
        raise SystemExit(f"aws_handover: {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def selector_arg(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    helm_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, helm_args = argv[:cut], argv[cut + 1 :]
    p = argparse.ArgumentParser(
        prog="aws_handover.py",
        description="Replace a release of AWS's neuron-helm-chart by this chart, keeping every node's Neuron "
        "resources advertised (one plugin restart per node) and every running pod's devices. "
        "Arguments after -- go to helm upgrade --install (e.g. --set, -f).",
    )
    p.add_argument("--from-release", required=True, help="the release of AWS's chart")
    p.add_argument("--from-namespace", default="default", help="its namespace (helm list -A shows it)")
    p.add_argument("--release", required=True, help="this chart's release name (may be the same)")
    p.add_argument("--namespace", default="default", help="this chart's release namespace")
    p.add_argument("--chart", type=Path, default=CHART, help="this chart (a path or a packaged .tgz)")
    p.add_argument("--timeout", default="5m", help="helm's --timeout for the upgrade")
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    return p.parse_args(argv), helm_args


def main(argv: Sequence[str] | None = None) -> int:
    a, helm_args = parse_args(argv)
    found = run("helm", "get", "manifest", a.from_release, "-n", a.from_namespace, check=False)
    if not found.strip():
        raise SystemExit(
            f"aws_handover: no release {a.from_release!r} in namespace {a.from_namespace!r} "
            "(helm list -A lists the releases; pass --from-release and --from-namespace)"
        )
    old = parse_manifest(found, a.from_namespace)
    if not any(r.kind == "DaemonSet" and "neuron-device-plugin" in r.name for r in old.refs):
        raise SystemExit(
            f"aws_handover: release {a.from_namespace}/{a.from_release} has no neuron-device-plugin DaemonSet: "
            "not a release of AWS's neuron-helm-chart"
        )
    rendered = run("helm", "template", a.release, str(a.chart), "-n", a.namespace, *helm_args)
    new = parse_manifest(rendered, a.namespace)
    same = (a.from_release, a.from_namespace) == (a.release, a.namespace)
    p = plan(old, new, same_release=same)
    for line in describe(p, a.release, a.namespace):
        print(f"[aws-handover] {line}", flush=True)
    if a.dry_run:
        return 0

    leftovers: list[tuple[Ref, dict[str, str]]] = []
    for ref in p.orphan:
        old_selector = old.selectors[ref]
        run("kubectl", "delete", *ref.args(), "--cascade=orphan", "--ignore-not-found", "--wait=true")
        if ref in p.relabel:
            # Every pod the old DaemonSet owned (orphaned now) gets the new selector's labels, and
            # loses the two by which a DaemonSet tells a pod of its current template: AWS's pods
            # carry pod-template-generation=1, which a new DaemonSet's generation 1 would take for
            # its own template, keeping AWS's plugin running under this chart's name.
            run("kubectl", "label", "pods", "-n", ref.namespace, "-l", selector_arg(old_selector),
                *(f"{k}={v}" for k, v in sorted(p.relabel[ref][1].items())),
                "pod-template-generation-", "controller-revision-hash-", "--overwrite")  # fmt: skip
        else:
            leftovers.append((ref, old_selector))
    for ref in p.delete_now:
        run("kubectl", "delete", *ref.args(), "--ignore-not-found", "--wait=true")
    for ref in p.adopt:
        run("kubectl", "annotate", *ref.args(), "--overwrite",
            f"meta.helm.sh/release-name={a.release}", f"meta.helm.sh/release-namespace={a.namespace}")  # fmt: skip
        run("kubectl", "label", *ref.args(), "--overwrite", "app.kubernetes.io/managed-by=Helm")
    if p.forget_old_release:
        run("kubectl", "delete", "secret", "-n", a.from_namespace, "-l", f"owner=helm,name={a.from_release}")
    run("helm", "upgrade", "--install", a.release, str(a.chart), "-n", a.namespace, "--create-namespace",
        "--wait", "--timeout", a.timeout, *helm_args)  # fmt: skip
    for ref in p.delete_after:
        run("kubectl", "delete", *ref.args(), "--ignore-not-found", "--wait=false")
    for ref, selector in leftovers:
        run("kubectl", "delete", "pods", "-n", ref.namespace, "-l", selector_arg(selector), "--ignore-not-found")
    old_name, new_name = f"{a.from_namespace}/{a.from_release}", f"{a.namespace}/{a.release}"
    print(f"[aws-handover] done: release {new_name} of this chart replaces {old_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
