"""A Pod's Neuron request, read as the kubelet counts it."""

from __future__ import annotations

from typing import Any

import pytest
from extender_objects import NAMES, NEURON, NEURONCORE, container, pod_object

from neuron_model.placement import ContainerRequest, PodRequest
from neuron_scheduler_extender.pods import (
    PodError,
    ResourceNames,
    neuron_request,
    pod_record,
    whole_quantity,
)


def test_limits_alone_requests_alone_or_both_count_the_same() -> None:
    for use in ("limits", "requests", "both"):
        pod = pod_object("p", containers=[container(devices=4, use=use), container("side", cores=2, use=use)])
        assert neuron_request(pod, NAMES) == PodRequest(
            (), (ContainerRequest(4, 0, "main"), ContainerRequest(0, 2, "side"))
        ), use


def test_requests_win_over_limits() -> None:
    # the API server refuses a pod where they differ; were it to come, requests are what is counted
    c = {"name": "main", "resources": {"requests": {NEURON: "2"}, "limits": {NEURON: "3"}}}
    assert neuron_request(pod_object("p", containers=[c]), NAMES).containers[0].devices == 2


def test_init_containers_keep_their_order_and_sidecars_are_restartable() -> None:
    pod = pod_object(
        "p",
        containers=[container(cores=1)],
        init_containers=[container("setup", devices=2), container("proxy", cores=1, restartPolicy="Always")],
    )
    request = neuron_request(pod, NAMES)
    assert request.init_containers == (
        ContainerRequest(2, 0, "setup", restartable=False),
        ContainerRequest(0, 1, "proxy", restartable=True),
    )
    # the kubelet's count: max(largest init (sidecars before it included), sidecars + app sum)
    assert request.effective == ContainerRequest(2, 2)


def test_the_deprecated_neurondevice_alias_counts_as_devices() -> None:
    c = {"name": "main", "resources": {"limits": {"aws.amazon.com/neurondevice": "2", NEURON: "1"}}}
    assert neuron_request(pod_object("p", containers=[c]), NAMES).containers[0].devices == 3


def test_another_prefix() -> None:
    names = ResourceNames.under("example.com")
    c = {"name": "main", "resources": {"limits": {"example.com/neuroncore": "3", NEURONCORE: "5"}}}
    assert neuron_request(pod_object("p", containers=[c]), names).containers[0].cores == 3


def test_containers_without_resources_ask_for_nothing() -> None:
    pod = pod_object("p", containers=[{"name": "plain", "image": "x"}, {"name": "empty", "resources": {}}])
    assert pod_record(pod, NAMES) is None  # not a Neuron pod: the view keeps nothing of it


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8", 8),
        (" 8 ", 8),
        ("+3", 3),
        ("2000m", 2),
        ("1k", 1000),
        ("1Ki", 1024),
        ("1e1", 10),
        ("0", 0),
        (4, 4),
        ("1.0", 1),
    ],
)
def test_whole_quantities(text: Any, value: int) -> None:
    assert whole_quantity(text, "x") == value


@pytest.mark.parametrize("text", ["1.5", "500m", "-1", "one", "", "1x", "1e99", True, None, 1.0])
def test_quantities_that_are_not_whole_device_counts(text: Any) -> None:
    with pytest.raises(PodError, match="x: "):
        whole_quantity(text, "x")


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda p: p.update(spec=None), "spec: expected an object"),
        (lambda p: p["spec"].update(containers={"name": "x"}), "spec.containers: expected a list"),
        (lambda p: p["spec"]["containers"].append("main"), "spec.containers[1]: expected an object"),
        (lambda p: p["spec"]["containers"][0]["resources"].update(limits=[1]), "spec.containers[0].resources.limits"),
        (lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({NEURON: "half"}), "aws.amazon.com/neuron"),
    ],
)
def test_a_malformed_spec_names_the_field(mutate: Any, where: str) -> None:
    pod = pod_object("p", devices=1)
    mutate(pod)
    with pytest.raises(PodError, match=r".*") as caught:
        neuron_request(pod, NAMES)
    assert where in str(caught.value)
    record = pod_record(pod, NAMES)
    assert record is not None
    assert record.request is None
    assert where in record.error


def test_record_of_a_bound_pod() -> None:
    pod = pod_object("p", namespace="ml", node="n1", devices=1, phase="Running", scheduled_at="2026-03-01T11:59:30Z")
    record = pod_record(pod, NAMES)
    assert record is not None
    assert (record.key, record.uid, record.node, record.terminal) == ("ml/p", "uid-ml-p", "n1", False)
    assert record.scheduled_at == ("2026-03-01T11:59:30Z", "2026-03-01T11:59:00Z")
    finished = pod_record(pod_object("q", node="n1", devices=1, phase="Succeeded"), NAMES)
    assert finished is not None
    assert finished.terminal
