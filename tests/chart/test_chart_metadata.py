"""What users see of the chart before installing it (`helm show chart|readme|values`, Artifact Hub): the
annotations, kubeVersion, CHANGELOG.md, the README's install section, the NOTES' image list, and defaults that
name no registry a user could be sent to in vain."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
import yaml_streams
from chart_tools import sets

pytestmark = pytest.mark.integration  # starts external processes: make integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "neuron-helm-chart"
HELM = str(REPO / ".venv" / "bin" / "helm")
CHART_YAML: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
ANNOTATIONS: dict[str, str] = CHART_YAML["annotations"]


def helm(*args: str) -> str:
    result = subprocess.run([HELM, *args], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def services() -> dict[str, dict[str, Any]]:
    return {
        p.parent.name: tomllib.loads(p.read_text())["project"]
        for p in sorted((REPO / "services").glob("*/pyproject.toml"))
    }


def rendered_images(*args: str, chart: Path = CHART) -> set[str]:
    out = helm("template", "neuron-helm-chart", str(chart), "--kube-version", "v1.36.3", *args)
    images: set[str] = set()
    for doc in yaml_streams.load_all(out):
        spec: Any = (doc or {}).get("spec", {})
        spec = spec.get("template", {}).get("spec", spec)
        images |= {c["image"] for c in spec.get("containers", [])}
    return images


def test_artifacthub_images_are_the_project_images_the_chart_renders() -> None:
    listed = yaml.safe_load(ANNOTATIONS["artifacthub.io/images"])
    assert [entry["name"] for entry in listed] == sorted(services())
    # the DRA driver replaces the device plugin on a node, so its image comes from a second rendering
    everything = rendered_images(*sets(scheduler__enabled=True, remediation__enabled=True)) | rendered_images(
        *sets(devicePlugin__enabled=False, draDriver__enabled=True)
    )
    project_images = {i for i in everything if "/neuron-helm-chart/" in i}
    assert {entry["image"] for entry in listed} == project_images


def test_artifacthub_license_is_the_services_license() -> None:
    assert {p["license"]["text"] for p in services().values()} == {ANNOTATIONS["artifacthub.io/license"]}


def test_artifacthub_links_are_named_https_urls() -> None:
    links = yaml.safe_load(ANNOTATIONS["artifacthub.io/links"])
    assert links
    for link in links:
        assert set(link) == {"name", "url"}
        assert link["url"].startswith("https://"), link


def changelog_sections() -> dict[str, str]:
    text = (CHART / "CHANGELOG.md").read_text()
    parts = re.split(r"^## (\S+)\n", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_changelog_has_the_chart_version_and_the_changes_annotation_is_its_entries() -> None:
    sections = changelog_sections()
    assert next(iter(sections)) == CHART_YAML["version"]  # newest first
    kinds = {"added", "changed", "deprecated", "removed", "fixed", "security"}
    changes = yaml.safe_load(ANNOTATIONS["artifacthub.io/changes"])
    entries: dict[str, list[str]] = {}
    for heading, body in re.findall(r"^### (\w+)\n\n((?:- .*\n)+)", sections[CHART_YAML["version"]], re.MULTILINE):
        entries[heading.lower()] = [line[2:] for line in body.splitlines()]
    assert set(entries) <= kinds
    assert [(c["kind"], c["description"]) for c in changes] == [(k, d) for k, ds in entries.items() for d in ds]


def test_kube_version_is_the_oldest_validated_and_admits_the_test_cluster() -> None:
    go_mod = (REPO / "tests" / "cluster" / "k8s" / "go.mod").read_text()
    cluster = re.search(r"^require k8s.io/kubernetes v(\d+)\.(\d+)\.(\d+)$", go_mod, re.MULTILINE)
    assert cluster
    # the chart tests validate every rendering against kubectl-validate's 1.30 schemas (test_chart.py)
    assert '"--version", "1.30"' in (REPO / "tests" / "chart" / "test_chart.py").read_text()
    assert CHART_YAML["kubeVersion"] == ">=1.30.0-0"
    helm("template", str(CHART), "--kube-version", f"v{cluster[1]}.{cluster[2]}.{cluster[3]}")
    refused = subprocess.run(
        [HELM, "template", str(CHART), "--kube-version", "v1.29.9"], capture_output=True, text=True, check=False
    )
    assert refused.returncode != 0
    assert "kubeVersion" in refused.stderr or "Kubernetes version" in refused.stderr, refused.stderr


def test_the_readme_installs_from_the_oci_registry_first() -> None:
    readme = (CHART / "README.md").read_text()
    install = readme[readme.index("## Install\n") :]
    first_command = re.search(r"```sh\n(.*?)```", install, re.DOTALL)
    assert first_command
    assert re.match(
        r"helm upgrade --install neuron-helm-chart oci://<registry>/neuron/neuron-helm-chart ", first_command[1]
    )


def test_the_readme_says_what_the_default_registry_is_and_why() -> None:
    readme = (CHART / "README.md").read_text()
    assert "The default registry is never one that does not exist" in readme
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # the source chart's default registry is the local build's name (make images), explained there
    assert values["devicePlugin"]["image"]["registry"] == "localhost"
    assert "localhost/neuron-helm-chart/<component>:<appVersion>" in readme


def test_notes_name_every_image_the_kubelet_pulls() -> None:
    digest = "sha256:" + "cd" * 32
    notes = helm("install", "neuron-helm-chart", str(CHART), "--dry-run=client",
                 *sets(scheduler__enabled=True, nodeMetrics__image__digest=digest))  # fmt: skip
    notes = notes[notes.index("NOTES:") :]
    for image in rendered_images(*sets(scheduler__enabled=True, nodeMetrics__image__digest=digest)):
        if "/neuron-helm-chart/" in image:
            assert image in notes, image
    assert f"localhost/neuron-helm-chart/node-metrics:{CHART_YAML['appVersion']}@{digest}" in notes
    assert "helm test" in notes
    assert "kubectl describe pod" in notes


def test_notes_warn_that_local_images_are_in_no_registry_unless_a_registry_is_set() -> None:
    def notes(*args: str) -> str:
        out = helm("install", "neuron-helm-chart", str(CHART), "--dry-run=client", *args)
        return out[out.index("NOTES:") :]

    warning = "These are the local images `make images` builds"
    assert warning in notes()
    assert warning not in notes(*sets(global__imageRegistry="registry.example.com/team"))
    assert warning not in notes(*sets(devicePlugin__image__registry="registry.example.com/team"))


def test_a_version_with_build_metadata_gives_valid_labels_and_the_tags_a_release_pushes(tmp_path: Path) -> None:
    """`make release VERSION=1.2.3+build.7` sets the chart's version and appVersion to it: "+" is no label value
    character nor an OCI tag's, so the chart writes "_" (as the release tags the images), or the API server
    refuses every object of the install."""
    chart = tmp_path / "neuron-helm-chart"
    shutil.copytree(CHART, chart)
    meta = (chart / "Chart.yaml").read_text()
    meta = re.sub(r"^appVersion: .*$", 'appVersion: "1.2.3+build.7"', meta, flags=re.MULTILINE)
    (chart / "Chart.yaml").write_text(meta)
    out = helm("template", "neuron-helm-chart", str(chart), *sets(scheduler__enabled=True))
    label_value = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
    versions = set()
    for doc in yaml_streams.load_all(out):
        labels = (doc or {}).get("metadata", {}).get("labels") or {}
        for value in labels.values():
            assert label_value.fullmatch(str(value)), value
            assert len(str(value)) <= 63, value
        versions.add(labels.get("app.kubernetes.io/version"))
    assert versions - {None} == {"1.2.3_build.7"}
    # the images' tags default to the appVersion (values.yaml leaves each `tag` empty)
    project = {i for i in rendered_images(*sets(scheduler__enabled=True), chart=chart) if "/neuron-helm-chart/" in i}
    assert project
    assert all(i.split("@")[0].endswith(":1.2.3_build.7") for i in project), project
