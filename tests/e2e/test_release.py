"""End to end, the way users get the chart: `make release` to the test cluster's registry (tests/registry.sh,
started by up.sh on cluster_access.REGISTRY), then `helm upgrade --install` from the OCI reference with the
kubelet pulling every image from that registry, and `helm test`. A version of its own (`<appVersion>-e2e.<time>`)
keeps the images `make images` imported out of it: nothing in containerd carries that tag, so every image the
pods run was pulled by reference and digest.

Runs with `-m e2e` against the test cluster (make cluster-test); the release builds the images with podman
(cached by `make images` just before).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import signing
import yaml
from cluster_access import (
    CTR,
    REGISTRY,
    REPO,
    SIM_ROOT,
    eventually,
    helm,
    helm_test_checks,
    helm_test_suites,
    kubectl,
    read,
    run,
)

CHART = REPO / "charts" / "neuron-helm-chart"
RELEASE = "neuron-helm-chart"
NAMESPACE = "neuron-e2e-release"
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
# the registry keeps what earlier runs pushed (its storage is under the cluster directory): a new version each run
VERSION = f"{APP_VERSION}-e2e.{int(time.time())}"
OCI_CHART = f"oci://{REGISTRY}/neuron/{RELEASE}"
# every object <release>-<component> in NAMESPACE, where these tests look for the pods and their Pulled events
SIMULATED_NODE = [
    "--set", "simulation.enabled=true", "--set", f"simulation.hostRoot={SIM_ROOT}", "--set", "objectNames=release",
]  # fmt: skip
MISSING_DIGEST = "sha256:" + "0" * 64

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]


def pod_images(selector: str) -> list[str]:
    pods = read("pods", namespace=NAMESPACE, selector=selector)["items"]
    return [c["image"] for p in pods for c in p["spec"]["containers"]]


def forget_pulled_images() -> None:
    """Remove from the cluster's containerd every image an earlier run pulled from the registry: the builds are
    reproducible, so an earlier run's `<registry>/neuron/<service>@<digest>` is this run's too, and the kubelet
    would find it present instead of pulling it."""
    ctr = [*CTR, "images"]
    listed = run(*ctr, "ls", "-q").stdout.split()
    pulled = [ref for ref in listed if ref.startswith(f"{REGISTRY}/neuron/")]
    if pulled:
        run(*ctr, "rm", *pulled)


@pytest.fixture(scope="module")
def release_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return signing.key_pair(tmp_path_factory.mktemp("release-key"))


@pytest.fixture(scope="module")
def released(release_key: tuple[Path, Path]) -> Iterator[dict[str, str]]:
    """`make release` to the cluster's registry (the work tree as it is: --allow-dirty); the released
    values' image references, by component."""
    helm("uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found", "--wait", check=False)
    forget_pulled_images()
    # --allow-dirty: the release of the work tree under test, as the other e2e suites install it
    run(sys.executable, REPO / "tools" / "release.py", "--registry", REGISTRY, "--version", VERSION, "--allow-dirty",
        "--sign-key", release_key[0], timeout=1800)  # fmt: skip
    values = yaml.safe_load(helm("show", "values", OCI_CHART, "--version", VERSION, "--plain-http").stdout)
    refs = {
        key: f"{image['registry']}/{image['repository']}:{image['tag']}@{image['digest']}"
        for key, image in ((key, values[key]["image"]) for key in ("devicePlugin", "nodeMetrics", "npd"))
    }
    assert all(ref.split("@")[0].endswith(f":{VERSION}") for ref in refs.values()), refs
    yield refs
    helm("uninstall", RELEASE, "-n", NAMESPACE, "--ignore-not-found", "--wait", check=False)
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)


def test_the_release_verifies_before_it_is_installed(released: dict[str, str], release_key: tuple[Path, Path]) -> None:
    """What a careful user checks first: every image and the chart carry the release key's signature,
    and every image a signed SBOM about that very image."""
    for ref in released.values():
        signing.verify(ref, release_key[1])
        subject, sbom = signing.attested_sbom(ref, release_key[1])
        assert "sha256:" + subject["digest"]["sha256"] == ref.rsplit("@", 1)[1]
        assert sbom["spdxVersion"] == "SPDX-2.3"
    chart = yaml.safe_load(helm("show", "chart", OCI_CHART, "--version", VERSION, "--plain-http").stdout)
    assert chart["version"] == VERSION
    record = json.loads((REPO / "build" / f"release-{VERSION}.json").read_text())
    signing.verify(record["chart"].removeprefix("oci://").replace(f":{VERSION}@", "@"), release_key[1])


def test_installs_from_the_registry_with_every_image_pulled_by_the_kubelet(released: dict[str, str]) -> None:
    result = helm(
        "upgrade", "--install", RELEASE, OCI_CHART, "--version", VERSION, "--plain-http",
        "--namespace", NAMESPACE, "--create-namespace", *SIMULATED_NODE, "--wait", "--timeout", "300s",
    )  # fmt: skip
    for ref in released.values():
        assert ref.startswith(f"{REGISTRY}/neuron/"), ref
        assert ref in result.stdout, f"NOTES do not name {ref}:\n{result.stdout}"
    running = set(pod_images(f"app.kubernetes.io/instance={RELEASE}"))
    assert running == set(released.values())
    # the kubelet pulled each of them (reason Pulled is also "already present on machine": the message tells)
    events = read("events", namespace=NAMESPACE, field_selector="reason=Pulled")
    pulled = " ".join(e["message"] for e in events["items"])
    for ref in released.values():
        assert f'Successfully pulled image "{ref}"' in pulled, f"the kubelet did not pull {ref}: {pulled}"


def test_helm_test_passes_on_the_installed_release(released: dict[str, str]) -> None:
    result = helm("test", RELEASE, "-n", NAMESPACE, "--logs", "--timeout", "300s")
    assert helm_test_suites(result.stdout) == {"components": "Succeeded", "allocation": "Succeeded"}, result.stdout
    assert helm_test_checks(result.stdout) == dict.fromkeys(
        ("capacity", "metrics", "monitoring", "health", "allocation"), True
    )


def test_a_wrong_digest_fails_the_install_and_helm_test_shows_the_kubelets_pull_error(
    released: dict[str, str],
) -> None:
    """The exporter's digest replaced by one the registry lacks: the upgrade never becomes ready, and `helm test`
    says why in the kubelet's words (the exporter: a stale node status cannot make its check pass, unlike the
    capacity or health checks)."""
    wrong = released["nodeMetrics"].rsplit("@", 1)[0] + "@" + MISSING_DIGEST
    failed = helm(
        "upgrade", RELEASE, OCI_CHART, "--version", VERSION, "--plain-http", "--namespace", NAMESPACE,
        *SIMULATED_NODE, "--set", f"nodeMetrics.image.digest={MISSING_DIGEST}", "--set", "tests.timeoutSeconds=15",
        "--wait", "--timeout", "20s", check=False,  # it can never be ready: the kubelet reports the pull in seconds
    )  # fmt: skip
    assert failed.returncode != 0, f"an install whose image cannot be pulled succeeded:\n{failed.stdout}"
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=node-metrics"
    eventually(lambda: pod_images(selector) == [wrong], "the exporter's pod is the one with the wrong digest", 120)
    result = helm("test", RELEASE, "-n", NAMESPACE, "--logs", "--timeout", "300s", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    # the test pod's log, printed by --logs: the check's reason, then the kubelet's waiting reason and message
    assert re.search(r"(ErrImagePull|ImagePullBackOff): .*" + re.escape(MISSING_DIGEST), output), output
    assert "not found" in output, output


def test_the_release_refuses_the_same_version_again(released: dict[str, str]) -> None:
    result = run(sys.executable, Path(REPO / "tools" / "release.py"), "--registry", REGISTRY, "--version", VERSION,
                 "--allow-dirty", "--sign-key", "/nonexistent", check=False)  # fmt: skip
    assert result.returncode == 1
    assert "is already in the registry" in result.stderr
