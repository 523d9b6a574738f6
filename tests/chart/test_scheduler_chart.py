"""The chart's Neuron-aware scheduling: the extender's Deployment, Service, PodDisruptionBudget and
least-privilege RBAC, the second kube-scheduler and its KubeSchedulerConfiguration, the helm test,
and the contradictions refused. Rendered by the real Helm 4 (the helpers of test_chart.py)."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart.test_chart import MONITORING_API, container, of_kind, refusal, render, sets
from prometheus_server import generator
from simcluster.schedulers import scheduler_config as simulated_scheduler_config

pytestmark = pytest.mark.integration  # starts external processes: make integration

ON = sets(scheduler__enabled=True)
RELEASE = "neuron-helm-chart"
EXTENDER = f"{RELEASE}-scheduler-extender"
SCHEDULER = f"{RELEASE}-kube-scheduler"
BUILD_K8S = Path(__file__).resolve().parents[1] / "cluster" / "build-k8s.sh"


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return doc


def scheduler_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(named(docs, "ConfigMap", SCHEDULER)["data"]["config.yaml"])  # type: ignore[no-any-return]


def test_off_by_default() -> None:
    docs = render()
    components = {d["metadata"]["labels"].get("app.kubernetes.io/component") for d in docs}
    assert not components & {"scheduler-extender", "kube-scheduler"}
    assert of_kind(docs, "Deployment") == []
    assert not [p for p in of_kind(docs, "Pod") if p["metadata"]["name"].endswith("-scheduling")]


def test_the_extender_alone_for_a_scheduler_of_ones_own() -> None:
    # the extender's NetworkPolicy must then be told who that scheduler is (test_network_policy.py)
    own = sets(
        scheduler__kubeScheduler__enabled=False,
        scheduler__extender__networkPolicy__schedulerFrom=[{"ipBlock": {"cidr": "10.0.0.0/24"}}],
    )
    docs = render(*ON, *own)
    components = {d["metadata"]["labels"].get("app.kubernetes.io/component") for d in docs}
    assert "scheduler-extender" in components
    assert "kube-scheduler" not in components
    assert not [p for p in of_kind(docs, "Pod") if p["metadata"]["name"].endswith("-scheduling")]


def test_the_extender_deployment() -> None:
    docs = render(*ON)
    deployment = named(docs, "Deployment", EXTENDER)
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    c = container(deployment)
    assert c["image"] == "localhost/neuron-helm-chart/scheduler-extender:0.1.0"
    tls_dir = "/etc/neuron-scheduling/tls"
    assert c["args"] == [
        "--listen=0.0.0.0:9843",
        "--log-level=info",
        "--report-max-age=2m",
        "--group-reservation-ttl=2m",
        "--scheduler-name=neuron-scheduler,my-scheduler",
        f"--tls-cert-file={tls_dir}/tls.crt",
        f"--tls-key-file={tls_dir}/tls.key",
        f"--client-ca-file={tls_dir}/ca.crt",
        f"--tls-server-name={EXTENDER}.kube-system.svc",
        f"--lease-name={EXTENDER}",
        "--lease-duration=15s",
        "--renew-deadline=10s",
        "--retry-period=2s",
    ]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name", "POD_IP": "status.podIP"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http", "scheme": "HTTPS"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http", "scheme": "HTTPS"}
    # nobody, read-only, no capability: it only talks to the API server
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65534
    assert c["securityContext"] == {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod.get("automountServiceAccountToken") is not False
    assert pod["serviceAccountName"] == EXTENDER
    # the replicas prefer different nodes
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_service_and_the_disruption_budget() -> None:
    docs = render(*ON)
    deployment = named(docs, "Deployment", EXTENDER)
    service = named(docs, "Service", EXTENDER)
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [{"name": "http", "port": 9843, "targetPort": "http", "protocol": "TCP"}]
    assert "clusterIP" not in service["spec"]
    pdb = named(docs, "PodDisruptionBudget", EXTENDER)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    single = render(*ON, *sets(scheduler__extender__replicas=1, scheduler__extender__leaderElection__enabled=False))
    assert of_kind(single, "PodDisruptionBudget") == [], "a budget over one replica would block every drain"
    assert "--no-leader-elect" in container(named(single, "Deployment", EXTENDER))["args"]
    assert not [r for r in of_kind(single, "Role") if r["metadata"]["name"] == EXTENDER]


def test_the_extender_reads_only_what_it_needs() -> None:
    docs = render(*ON)
    assert named(docs, "ClusterRole", EXTENDER)["rules"] == [
        {"apiGroups": ["neuron.aws.com"], "resources": ["neuronnodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
        # Nodes for their NeuronHealth condition and taint; Events on the pods of a degraded UltraServer group
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
        # PodDisruptionBudgets, which preemption weighs its victims against
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "get", "patch"]},
    ]
    assert "--evict-degraded-groups" not in container(named(docs, "Deployment", EXTENDER))["args"]
    # evicting a degraded group is off by default; on, and only then, the extender may evict pods
    evicting = render(*ON, *sets(scheduler__extender__evictDegradedGroups=True))
    assert named(evicting, "ClusterRole", EXTENDER)["rules"][-1] == {
        "apiGroups": [""],
        "resources": ["pods/eviction"],
        "verbs": ["create"],
    }
    assert "--evict-degraded-groups" in container(named(evicting, "Deployment", EXTENDER))["args"]
    binding = named(docs, "ClusterRoleBinding", EXTENDER)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": EXTENDER, "namespace": "kube-system"}]
    role = named(docs, "Role", EXTENDER)
    assert role["metadata"]["namespace"] == "kube-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [EXTENDER],
            "verbs": ["get", "update"],
        },
    ]


def test_the_second_scheduler_has_the_upstream_roles_and_its_own_lease() -> None:
    docs = render(*ON)
    bound = {
        b["roleRef"]["name"]: b
        for b in of_kind(docs, "ClusterRoleBinding") + of_kind(docs, "RoleBinding")
        if b["subjects"][0]["name"] == SCHEDULER
    }
    assert set(bound) == {
        "system:kube-scheduler",
        "system:volume-scheduler",
        "extension-apiserver-authentication-reader",
        SCHEDULER,
    }
    assert bound["extension-apiserver-authentication-reader"]["metadata"]["namespace"] == "kube-system"
    assert named(docs, "Role", SCHEDULER)["rules"][1] == {
        "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["neuron-scheduler"], "verbs": ["get", "update"],
    }  # fmt: skip


def test_the_kube_scheduler_configuration() -> None:
    docs = render(*ON)
    config = scheduler_config(docs)
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    # its own name, and AWS's default name, so pods written for AWS's chart are placed unchanged
    assert config["profiles"] == [{"schedulerName": "neuron-scheduler"}, {"schedulerName": "my-scheduler"}]
    assert config["leaderElection"] == {
        "leaderElect": True,
        "resourceLock": "leases",
        "resourceName": "neuron-scheduler",
        "resourceNamespace": "kube-system",
        "leaseDuration": "15s",
        "renewDeadline": "10s",
        "retryPeriod": "2s",
    }
    assert config["extenders"] == [
        {
            "urlPrefix": f"https://{EXTENDER}.kube-system.svc:9843",
            "filterVerb": "filter",
            "prioritizeVerb": "prioritize",
            "weight": 10,
            "bindVerb": "bind",
            "preemptVerb": "preempt",
            "enableHTTPS": True,
            "tlsConfig": {
                "serverName": f"{EXTENDER}.kube-system.svc",
                "certFile": "/etc/neuron-scheduling/tls/tls.crt",
                "keyFile": "/etc/neuron-scheduling/tls/tls.key",
                "caFile": "/etc/neuron-scheduling/tls/ca.crt",
            },
            "nodeCacheCapable": True,
            "httpTimeout": "10s",
            "ignorable": False,
            "managedResources": [
                {"name": "aws.amazon.com/neuron", "ignoredByScheduler": False},
                {"name": "aws.amazon.com/neuroncore", "ignoredByScheduler": False},
            ],
        }
    ]
    deployment = named(docs, "Deployment", SCHEDULER)
    c = container(deployment)
    assert c["command"] == ["/usr/local/bin/kube-scheduler"]
    assert c["args"] == ["--config=/etc/neuron-scheduler/config.yaml", "--v=2"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert c["ports"] == [{"name": "https", "containerPort": 10259, "protocol": "TCP"}]
    config_volume, tls_volume = deployment["spec"]["template"]["spec"]["volumes"]
    assert config_volume["configMap"]["name"] == SCHEDULER
    assert tls_volume["secret"]["secretName"] == f"{EXTENDER}-tls"
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_the_scheduling_simulation_calls_the_extender_as_the_chart_does() -> None:
    """The 1,000-node figures (`make bench`) are those of the chart's configuration: the simulation's
    neuron-scheduler has the chart's profiles and extender stanza, the extender's address apart."""
    chart = scheduler_config(render(*ON))
    simulated = simulated_scheduler_config(Path("kubeconfig"), "neuron-scheduler", "http://127.0.0.1:1")
    assert simulated["profiles"] == chart["profiles"][:1]  # the simulation's pods name the first
    for config in (chart, simulated):
        config["extenders"][0].pop("urlPrefix")
    # the simulation calls the extender over plain HTTP (its figures leave out the TLS handshake and
    # encryption, which keep-alive connections pay once per connection)
    for key in ("enableHTTPS", "tlsConfig"):
        chart["extenders"][0].pop(key)
        simulated["extenders"][0].pop(key, None)
    assert simulated["extenders"] == chart["extenders"]
    assert simulated.get("percentageOfNodesToScore") == chart.get("percentageOfNodesToScore")


def test_a_fixed_cluster_ip_the_alias_and_the_weight_reach_the_configuration() -> None:
    docs = render(
        *ON,
        *sets(
            scheduler__extender__service__clusterIP="10.96.0.53",
            scheduler__extender__weight=3,
            scheduler__schedulerName="trainium",
            devicePlugin__neurondeviceAlias=True,
        ),
    )
    config = scheduler_config(docs)
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == "https://10.96.0.53:9843"
    assert extender["tlsConfig"]["serverName"] == f"{EXTENDER}.kube-system.svc"  # the certificate's name
    assert named(docs, "Service", EXTENDER)["spec"]["clusterIP"] == "10.96.0.53"
    assert extender["weight"] == 3
    assert [r["name"] for r in extender["managedResources"]][-1] == "aws.amazon.com/neurondevice"
    assert config["profiles"] == [{"schedulerName": "trainium"}, {"schedulerName": "my-scheduler"}]
    alone = scheduler_config(render(*ON, *sets(scheduler__additionalSchedulerNames=[])))
    assert alone["profiles"] == [{"schedulerName": "neuron-scheduler"}]
    assert config["leaderElection"]["resourceName"] == "trainium"


def test_a_configuration_change_rolls_the_scheduler() -> None:
    def checksum(*args: str) -> str:
        deployment = named(render(*ON, *args), "Deployment", SCHEDULER)
        return deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]  # type: ignore[no-any-return]

    assert checksum() != checksum(*sets(scheduler__extender__weight=2))


@pytest.mark.parametrize(
    ("args", "image"),
    [
        (["--kube-version", "v1.36.3"], "registry.k8s.io/kube-scheduler:v1.36.3"),
        (["--kube-version", "v1.31.2-eks-7f9249a"], "registry.k8s.io/kube-scheduler:v1.31.2"),
        (["--kube-version", "v1.36.3", *sets(scheduler__kubeScheduler__image__tag="v1.36.0")], "registry.k8s.io/kube-scheduler:v1.36.0"),
        (sets(global__imageRegistry="mirror.internal"), "mirror.internal/kube-scheduler:v"),
        (["--kube-version", "v1.36.3", *sets(scheduler__kubeScheduler__image__digest="sha256:" + "ab" * 32)],
         "registry.k8s.io/kube-scheduler:v1.36.3@sha256:abab"),
    ],
    ids=["cluster-version", "vendor-suffix-dropped", "tag", "global-registry", "digest"],
)  # fmt: skip
def test_the_scheduler_image_is_the_clusters_version(args: list[str], image: str) -> None:
    got = container(named(render(*ON, *args), "Deployment", SCHEDULER))["image"]
    assert got.startswith(image), got


def test_helm_test_checks_a_pod_naming_the_scheduler_is_placed() -> None:
    docs = render(*ON)
    (pod,) = [p for p in of_kind(docs, "Pod") if p["metadata"]["name"].endswith("-scheduling")]
    assert pod["spec"]["schedulerName"] == "neuron-scheduler"
    (c,) = pod["spec"]["containers"]
    assert c["resources"]["limits"]["aws.amazon.com/neuron"] == 1
    assert c["command"][-1] == "scheduling"
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (sets(scheduler__enabled=True, devicePlugin__enabled=False), "scheduler.enabled needs devicePlugin.enabled"),
        (
            sets(scheduler__enabled=True, scheduler__extender__leaderElection__enabled=False),
            "scheduler.extender.replicas=2 needs scheduler.extender.leaderElection.enabled",
        ),
        (
            sets(scheduler__enabled=True, scheduler__kubeScheduler__leaderElection__enabled=False),
            "scheduler.kubeScheduler.replicas=2 needs scheduler.kubeScheduler.leaderElection.enabled",
        ),
    ],
    ids=["without-device-plugin", "extender-replicas-without-election", "scheduler-replicas-without-election"],
)
def test_contradictions_fail_with_what_to_change(args: list[str], message: str) -> None:
    assert message in refusal(*args)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (sets(scheduler__schedulerName="Neuron Scheduler"), "/scheduler/schedulerName"),
        (sets(scheduler__extender__reportMaxAge="two minutes"), "/scheduler/extender/reportMaxAge"),
        (sets(scheduler__extender__weight=0), "/scheduler/extender/weight"),
        (sets(scheduler__extender__service__clusterIP="extender.local"), "/scheduler/extender/service/clusterIP"),
        (sets(scheduler__kubeScheduler__replica=2), "additional properties 'replica' not allowed"),
    ],
    ids=["scheduler-name", "duration", "weight", "cluster-ip", "misspelt-key"],
)
def test_the_schema_rejects_mistakes(args: list[str], message: str) -> None:
    stderr = refusal(*args)
    assert "values don't meet the specifications of the schema" in stderr
    assert message in stderr, stderr


# --- the real kube-scheduler reads the configuration ---------------------------------------------


@functools.cache
def kube_scheduler() -> Path:
    """The test cluster's kube-scheduler, built from the pinned Kubernetes module by build-k8s.sh (make setup)."""
    result = subprocess.run([str(BUILD_K8S)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{BUILD_K8S} failed (make setup builds it):\n{result.stderr}"
    return Path(result.stdout.strip().splitlines()[-1].rsplit(" cached in ", 1)[1]) / "kube-scheduler"


def load_with_kube_scheduler(config: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """kube-scheduler's own loading, defaulting and validation of the file (--write-config-to stops
    it there); a kubeconfig is needed to get that far, and never dialled."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "x",
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
            "users": [{"name": "u", "user": {"token": "unused"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        })
    )  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(dict(config, clientConnection={"kubeconfig": str(kubeconfig)})))
    return subprocess.run(
        [str(kube_scheduler()), f"--config={path}", f"--write-config-to={tmp_path / 'out.yaml'}", "--secure-port=0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "values",
    [ON, [*ON, *sets(devicePlugin__neurondeviceAlias=True, scheduler__extender__service__clusterIP="10.96.0.53")]],
    ids=["defaults", "alias-and-ip"],
)
def test_the_real_kube_scheduler_accepts_the_configuration(values: list[str], tmp_path: Path) -> None:
    import base64

    docs = render(*values)
    config = scheduler_config(docs)
    # the Secret's files where the pod mounts them, here under tmp_path (kube-scheduler opens them)
    secret = named(docs, "Secret", f"{EXTENDER}-tls")
    tls_config = config["extenders"][0]["tlsConfig"]
    for field, key in (("certFile", "tls.crt"), ("keyFile", "tls.key"), ("caFile", "ca.crt")):
        (tmp_path / key).write_bytes(base64.b64decode(secret["data"][key]))
        assert tls_config[field] == f"/etc/neuron-scheduling/tls/{key}"
        tls_config[field] = str(tmp_path / key)
    result = load_with_kube_scheduler(config, tmp_path)
    assert result.returncode == 0, result.stderr
    loaded = yaml.safe_load((tmp_path / "out.yaml").read_text())
    assert loaded["extenders"][0]["urlPrefix"] == config["extenders"][0]["urlPrefix"]
    assert [p["schedulerName"] for p in loaded["profiles"]] == ["neuron-scheduler", "my-scheduler"]


def test_the_real_kube_scheduler_refuses_a_broken_configuration(tmp_path: Path) -> None:
    """The check above can fail: kube-scheduler validates what it reads."""
    config = scheduler_config(render(*ON))
    config["extenders"][0]["weight"] = 0
    result = load_with_kube_scheduler(config, tmp_path)
    assert result.returncode != 0
    assert "extenders[0].weight: Invalid value: 0: must have a positive weight applied to it" in result.stderr


def test_the_extenders_service_monitor_feeds_the_scheduling_dashboard() -> None:
    def monitors(*args: str, kind: str = "ServiceMonitor") -> list[dict[str, Any]]:
        return [d for d in of_kind(render(*ON, *args), kind) if d["metadata"]["name"] == EXTENDER]

    assert monitors() == [], "like the exporter's: only where the monitoring API is served, or forced"
    assert monitors(*MONITORING_API, *sets(scheduler__extender__monitoring__enabled=False)) == []
    assert monitors(*MONITORING_API, *sets(nodeMetrics__monitoring__kind="none")) == []
    assert len(monitors(*sets(nodeMetrics__monitoring__force=True))) == 1
    (pod_monitor,) = monitors(*MONITORING_API, *sets(nodeMetrics__monitoring__kind="PodMonitor"), kind="PodMonitor")
    (endpoint,) = pod_monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "http"
    docs = render(*ON, *MONITORING_API, *sets(nodeMetrics__monitoring__additionalLabels={"release": "kps"}))
    sm = named(docs, "ServiceMonitor", EXTENDER)
    service = named(docs, "Service", EXTENDER)
    assert sm["metadata"]["labels"]["release"] == "kps"
    assert sm["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    # the job the dashboards' tests scrape the extender as
    job = {"targetLabel": "job", "replacement": generator().SCHEDULER_EXTENDER}
    assert job in endpoint["relabelings"]


def test_mutual_tls_secret_is_generated_once_or_taken_from_the_user() -> None:
    import base64
    import subprocess
    import tempfile

    docs = render(*ON)
    secret = named(docs, "Secret", f"{EXTENDER}-tls")
    assert secret["type"] == "kubernetes.io/tls"
    with tempfile.TemporaryDirectory() as tmp:
        for key in ("ca.crt", "tls.crt"):
            Path(tmp, key).write_bytes(base64.b64decode(secret["data"][key]))
        verified = subprocess.run(
            ["openssl", "verify", "-CAfile", f"{tmp}/ca.crt", f"{tmp}/tls.crt"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert verified.returncode == 0, verified.stderr
        text = subprocess.run(
            ["openssl", "x509", "-in", f"{tmp}/tls.crt", "-noout", "-ext", "extendedKeyUsage,subjectAltName"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    # both sides present it, and the scheduler checks the Service's name whatever address it dials
    assert "TLS Web Server Authentication, TLS Web Client Authentication" in text
    assert f"DNS:{EXTENDER}.kube-system.svc" in text
    # the user's (cert-manager's) Secret: none generated, every mount and monitor names it
    own = render(*ON, *sets(scheduler__extender__tls__secretName="my-extender-cert"))
    assert not [d for d in of_kind(own, "Secret") if d["metadata"]["name"].endswith("-tls")]
    for name in (EXTENDER, SCHEDULER):
        volumes = named(own, "Deployment", name)["spec"]["template"]["spec"]["volumes"]
        assert {"name": "tls", "secret": {"secretName": "my-extender-cert"}} in volumes


def test_without_tls_plain_http_and_no_secret() -> None:
    docs = render(*ON, *sets(scheduler__extender__tls__enabled=False))
    (extender,) = scheduler_config(docs)["extenders"]
    assert extender["urlPrefix"].startswith("http://")
    assert extender["enableHTTPS"] is False
    assert "tlsConfig" not in extender
    assert not [d for d in of_kind(docs, "Secret") if d["metadata"]["name"].endswith("-tls")]
    c = container(named(docs, "Deployment", EXTENDER))
    assert not [a for a in c["args"] if a.startswith("--tls")]
    assert "scheme" not in c["readinessProbe"]["httpGet"]
