"""The per-node gauges: what each node has free as the filter sees it, read from the live view at scrape time."""

from __future__ import annotations

from extender_objects import NOW, pod_object, report_object, view_of
from oracles.neuron_sets import topology
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from neuron_scheduler_extender.metrics import Metrics
from neuron_scheduler_extender.state import ClusterView


def scrape(view: ClusterView) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    metrics = Metrics()
    metrics.watch_nodes(lambda: (view.node(n, NOW) for n in list(view.reports)))
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("neuron_scheduler_extender_node_")
    }


def free_groups(instance_type: str, free_devices: set[int]) -> dict[str, float]:
    """Valid groups of each size entirely free, counted from the topology's groups themselves."""
    topo = topology(instance_type)
    return {str(size): float(sum(1 for g in topo.groups(size) if g <= free_devices)) for size in topo.group_sizes}


def test_free_cores_and_groups_per_node_count_the_pods_in_flight() -> None:
    trn1 = topology("trn1.32xlarge")
    view = view_of(
        report_object("half", free_devices=range(8), unhealthy=[15]),
        report_object("stale", age=600),
        # bound there, not in the report yet: its device counts as taken
        pods=[pod_object("in-flight", node="half", devices=1, phase="Running")],
    )
    samples = scrape(view)
    nodes = {dict(labels)["node"] for _, labels in samples}
    assert nodes == {"half"}, "a refused node (stale report) has no free state to show"
    per_device = trn1.cores_per_device
    assert samples["neuron_scheduler_extender_node_cores", (("node", "half"),)] == 15 * per_device
    assert samples["neuron_scheduler_extender_node_free_cores", (("node", "half"),)] == 7 * per_device
    held = view.node("half", NOW).free
    assert held is not None
    expected = free_groups("trn1.32xlarge", set(held.devices))
    got = {
        dict(labels)["size"]: value
        for (name, labels), value in samples.items()
        if name == "neuron_scheduler_extender_node_free_device_groups"
    }
    assert got == expected
    assert got["1"] == 7
    assert 0 in got.values(), "every size is exported, the empty ones too"
