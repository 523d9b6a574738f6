"""Every container of ours that every ci/ values file renders, its arguments and environment fed to
its own service's parser (`<service>.config.parse(argv, env)`, which reads the NEURON_*_ env twins
as the container would): what the chart writes, the service takes. The chart's values and the
services' flags are declared in two places; this is where the two must agree, for every rendering
`ct lint` and `ct install` use. Containers of other images (kube-scheduler, KMM's driver images)
are not ours to parse; a container of ours no parser below claims fails the test.

STAND-INS: an env variable from the downward API (`valueFrom.fieldRef`) has the value the kubelet
would give it on a node of the test cluster (FIELD_VALUES); any other `valueFrom` fails the test,
so a new one is given a stand-in here on purpose. The parsers check that the files they are given
exist: a path in an argument or env value below one of the container's volumeMounts is moved below
a scratch directory, where the mount's directory and that file (empty) are made. A path below no
mount stays as it is, and a file the container would not have then fails its parser here too.
"""

from __future__ import annotations

import functools
import importlib.util
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml_streams
from chart_tools import KMM_API, NFD_API
from neuron_dra_driver import config as dra_driver

from neuron_device_plugin import config as device_plugin
from neuron_node_metrics import config as node_metrics
from neuron_problem_detector import config as problem_detector
from neuron_remediation import config as remediation
from neuron_scheduler_extender import config as scheduler_extender

pytestmark = pytest.mark.integration  # runs helm

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "neuron-helm-chart"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
HELM = str(REPO / ".venv" / "bin" / "helm")
NAMESPACE = "kube-system"
# Every optional API the chart renders objects for, so that each ci file renders all it can.
APIS = [*KMM_API, *NFD_API, *(a for api in ("monitoring.coreos.com/v1", "security.openshift.io/v1",
        "resource.k8s.io/v1") for a in ("--api-versions", api))]  # fmt: skip
FIELD_VALUES = {
    "spec.nodeName": "sim-node-1",
    "metadata.namespace": NAMESPACE,
    "metadata.name": "neuron-pod-0",
    "status.podIP": "10.0.0.7",
    "metadata.uid": "5f0c3a1e-7d2b-4c9a-8e61-2b7d9f0a4c13",
}
WORKLOADS = ("DaemonSet", "Deployment", "StatefulSet", "Job", "Pod")
# Our images are `<registry>/neuron-helm-chart/<name>` (values.yaml's image.repository of each component).
OUR_REPOSITORY = "neuron-helm-chart/"


def _helm_test() -> ModuleType:
    spec = importlib.util.spec_from_file_location("helm_test", CHART / "files" / "helm_test.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HELM_TEST = _helm_test()


@dataclass(frozen=True)
class Container:
    where: str  # values file, kind/name, container
    image: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: dict[str, str]
    mounts: tuple[str, ...] = ()  # the volumeMounts' mountPaths

    @property
    def repository(self) -> str:
        """The image's repository, without registry, tag or digest."""
        name = self.image.split("@")[0]
        if ":" in name.rsplit("/", 1)[-1]:
            name = name.rsplit(":", 1)[0]
        first, _, rest = name.partition("/")
        return rest if rest and ("." in first or ":" in first or first == "localhost") else name


def _env(entries: list[dict[str, Any]], where: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for e in entries:
        if "value" in e:
            env[e["name"]] = str(e["value"])
        elif "fieldRef" in e.get("valueFrom", {}):
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            assert path in FIELD_VALUES, f"{where}: {e['name']} from {path}, which has no stand-in here"
            env[e["name"]] = FIELD_VALUES[path]
        else:
            raise AssertionError(f"{where}: {e['name']} comes from {e.get('valueFrom')}, which has no stand-in here")
    return env


def _containers(values: Path, docs: list[dict[str, Any]]) -> Iterator[Container]:
    for doc in docs:
        if doc.get("kind") not in WORKLOADS:
            continue
        spec = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
        for kind in ("initContainers", "containers"):
            for c in spec.get(kind) or []:
                where = f"{values.name} {doc['kind']}/{doc['metadata']['name']} {kind} {c['name']}"
                assert not c.get("envFrom"), f"{where}: envFrom is not read here"
                mounts = tuple(m["mountPath"] for m in c.get("volumeMounts") or [])
                yield Container(where, c["image"], tuple(c.get("command") or ()), tuple(c.get("args") or ()),
                                _env(c.get("env") or [], where), mounts)  # fmt: skip


@functools.cache
def rendered(values: Path) -> tuple[Container, ...]:
    result = subprocess.run(
        [HELM, "template", "neuron-helm-chart", str(CHART), "--namespace", NAMESPACE, "-f", str(values), *APIS],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"helm template -f {values.name}: {result.stderr}"
    return tuple(_containers(values, [d for d in yaml_streams.load_all(result.stdout) if d]))


def _helm_test_parse(c: Container) -> object:
    """helm_test.py's own reading of its command line: checks by name, each once (its main() refuses others)."""
    argv = [*c.command[1:], *c.args]
    assert Path(argv[0]).name == "helm_test.py", c.where
    checks = argv[1:]
    assert checks, c.where
    assert len(set(checks)) == len(checks), f"{c.where}: {checks}"
    unknown = [name for name in checks if name not in HELM_TEST.MODES]
    assert not unknown, f"{c.where}: helm_test.py has no check {unknown}"
    return checks


# image repository -> the service's own parse(argv, env); the helm test pods run in the problem
# detector's image with helm_test.py as their command
PARSERS: dict[str, Callable[[list[str], dict[str, str]], object]] = {
    "neuron-helm-chart/device-plugin": device_plugin.parse,
    "neuron-helm-chart/node-metrics": node_metrics.parse,
    "neuron-helm-chart/node-problem-detector": problem_detector.parse,
    "neuron-helm-chart/dra-driver": dra_driver.parse,
    "neuron-helm-chart/scheduler-extender": scheduler_extender.parse,
    "neuron-helm-chart/remediation-controller": remediation.parse,
}


def _mounted(value: str, mounts: tuple[str, ...], root: Path) -> str:
    """`value` (an argument, `--flag=value`, or an env value) with a path below a mount moved below `root`."""
    flag, eq, path = value.partition("=") if value.startswith("--") else ("", "", value)
    for mount in sorted(mounts, key=len, reverse=True):
        if path == mount or path.startswith(mount.rstrip("/") + "/"):
            moved = root / path.lstrip("/")
            # `root` is shared by the module's tests, which xdist runs in any order: one container's
            # file (the detector's --verdict-dir, below its state mount) is another's mount point
            mount_dir = root / mount.lstrip("/")
            if mount_dir.is_file():
                mount_dir.unlink()
            mount_dir.mkdir(parents=True, exist_ok=True)
            if path != mount and not moved.exists():
                moved.parent.mkdir(parents=True, exist_ok=True)
                moved.touch()
            return f"{flag}{eq}{moved}"
    return value


def parse(c: Container, root: Path) -> object:
    """What the container's program makes of its arguments and environment (raises as it would),
    its mounted files made below `root`."""
    if c.command and Path(c.command[1] if len(c.command) > 1 else c.command[0]).name == "helm_test.py":
        return _helm_test_parse(c)
    assert not c.command, f"{c.where}: runs {c.command}, not its image's service"
    args = [_mounted(a, c.mounts, root) for a in c.args]
    env = {k: _mounted(v, c.mounts, root) for k, v in c.env.items()}
    return PARSERS[c.repository](args, env)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mounts")


def ours(c: Container) -> bool:
    return c.repository.startswith(OUR_REPOSITORY)


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_every_container_of_ours_parses_what_the_chart_gives_it(values: Path, root: Path) -> None:
    containers = [c for c in rendered(values) if ours(c)]
    assert containers, f"{values.name} renders none of our containers"
    for c in containers:
        assert c.command or c.repository in PARSERS, f"{c.where}: no parser for {c.image}"
        try:
            cfg = parse(c, root)
        except SystemExit as exc:  # argparse's refusal: its message is on stderr
            pytest.fail(f"{c.where}: its parser refused {list(c.args)} with env {c.env} (exit {exc.code})")
        assert cfg is not None, f"{c.where}: parsed as a one-off command (--list-metrics or the like)"


def test_every_service_is_parsed_in_some_rendering(root: Path) -> None:
    """The ci files between them run every service, and the values come through as given."""
    seen: dict[str, list[tuple[Container, Any]]] = {}
    for values in CI_VALUES:
        for c in rendered(values):
            if ours(c) and not c.command:
                seen.setdefault(c.repository, []).append((c, parse(c, root)))
    assert set(seen) == set(PARSERS)
    node = FIELD_VALUES["spec.nodeName"]
    # the node name reaches each node agent through its env twin, from the downward API
    for repository in ("neuron-helm-chart/device-plugin", "neuron-helm-chart/dra-driver",
                       "neuron-helm-chart/node-problem-detector"):  # fmt: skip
        assert {cfg.node_name for _, cfg in seen[repository]} == {node}, repository
    for c, cfg in seen["neuron-helm-chart/node-metrics"]:
        flags = dict(a[2:].split("=", 1) for a in c.args if a.startswith("--") and "=" in a)
        assert str(cfg.host_root) == _mounted(flags["host-root"], c.mounts, root), c.where
        assert cfg.naming == flags["naming"], c.where
    # all-on's breaker, and the namespaces of the chart's own components kept from every drain
    for _, cfg in seen["neuron-helm-chart/remediation-controller"]:
        assert cfg.safety.max_percent == 1, "all-on-values.yaml: a breaker that never opens on a test cluster"
        assert NAMESPACE in cfg.policy.keep_namespaces


# -- the check can fail ------------------------------------------------------------------------


def _one(repository: str) -> Container:
    return next(c for values in CI_VALUES for c in rendered(values) if c.repository == repository and not c.command)


@pytest.mark.parametrize("repository", sorted(PARSERS))
def test_a_wrong_argument_is_refused(repository: str, root: Path) -> None:
    c = _one(repository)
    parse(c, root)
    with pytest.raises(SystemExit):
        parse(Container(c.where, c.image, c.command, (*c.args, "--no-such-flag"), c.env, c.mounts), root)


def test_a_wrong_env_twin_is_refused(root: Path) -> None:
    c = _one("neuron-helm-chart/node-metrics")
    wrong = {**c.env, node_metrics.parser({}).env_name("--naming"): "nonsense"}
    with pytest.raises(SystemExit):
        parse(Container(c.where, c.image, c.command, c.args, wrong, c.mounts), root)


def test_a_file_no_volume_mounts_is_refused(root: Path) -> None:
    c = _one("neuron-helm-chart/scheduler-extender")
    tls = [a for a in c.args if a.startswith("--tls-cert-file=")]
    assert tls, "the scheduler's ci file serves TLS"
    with pytest.raises(SystemExit):
        parse(Container(c.where, c.image, c.command, c.args, c.env, ()), root)


def test_a_helm_test_check_that_does_not_exist_is_refused(root: Path) -> None:
    c = next(c for values in CI_VALUES for c in rendered(values) if ours(c) and c.command)
    parse(c, root)
    with pytest.raises(AssertionError, match="no check"):
        parse(Container(c.where, c.image, c.command, (*c.args, "colour"), c.env, c.mounts), root)
