"""kernelLog.syslogFile: the node agents read the host's syslog file of the kernel log instead of /dev/kmsg,
unprivileged and without CAP_SYSLOG, through a read-only mount of the file's directory (issue 24 item 2).
Rendered by the real Helm; the flags the pods get are parsed by the services' own parsers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chart.test_chart import CHART, _host_path_of, container, daemonset, of_kind, refusal, render, sets
from neuron_dra_driver import config as dra_config

from neuron_device_plugin import config as plugin_config
from neuron_problem_detector import config as npd_config

pytestmark = pytest.mark.integration  # starts helm

PLUGIN_ONLY = ["-f", str(CHART / "ci" / "device-plugin-only-values.yaml")]


def syslog(path: str = "/var/log/kern.log") -> list[str]:
    return sets(kernelLog__syslogFile=path)


def assert_reads_the_file_unprivileged(ds: dict[str, Any], host_file: str) -> list[str]:
    c = container(ds)
    args = c["args"]
    assert "--kernel-log-format=syslog" in args
    (path,) = [a.removeprefix("--kmsg-path=") for a in args if a.startswith("--kmsg-path=")]
    assert _host_path_of(ds, path) == host_file
    directory = str(Path(path).parent)
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == directory]
    assert mount["readOnly"] is True
    (volume,) = [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"] == {"path": str(Path(host_file).parent), "type": "Directory"}
    assert _host_path_of(ds, "/host/etc/localtime") == "/etc/localtime"
    sc = c["securityContext"]
    assert "privileged" not in sc
    assert sc["allowPrivilegeEscalation"] is False
    assert "add" not in sc["capabilities"], "no CAP_SYSLOG for an ordinary file"
    assert sc["capabilities"]["drop"] == ["ALL"]
    # no /dev/kmsg in the arguments, and /host/dev stays as it was (read-only, for the device nodes)
    assert not [a for a in args if "/dev/kmsg" in a]
    return args


@pytest.mark.parametrize("host_file", ["/var/log/kern.log", "/var/log/messages"])
def test_the_detector_reads_the_file_unprivileged(host_file: str) -> None:
    docs = render(*syslog(host_file))
    args = assert_reads_the_file_unprivileged(daemonset(docs, "problem-detector"), host_file)
    # the detector's own parser takes what the chart gives it
    cfg = npd_config.parse(
        [a for a in args if a.startswith(("--kmsg-path", "--kernel-log-format"))] + ["--node-name", "n"], env={}
    )
    assert cfg.kernel_log_format == "syslog"
    # with the detector, the plugin takes its verdicts and reads no kernel log: nothing changes for it
    plugin = container(daemonset(docs, "device-plugin"))
    assert "--kmsg-path=none" in plugin["args"]
    assert "--kernel-log-format=syslog" not in plugin["args"]


def test_without_the_file_the_detector_stays_privileged_for_dev_kmsg() -> None:
    sc = container(daemonset(render(), "problem-detector"))["securityContext"]
    assert sc["privileged"] is True
    assert sc["capabilities"]["add"] == ["SYSLOG"]


def test_in_simulation_mode_the_value_is_unused() -> None:
    ds = daemonset(render(*syslog(), *sets(simulation__enabled=True)), "problem-detector")
    assert "--kernel-log-format=syslog" not in container(ds)["args"]
    assert not [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "host-kernel-log"]


def test_without_the_detector_the_plugin_reads_the_file_unprivileged() -> None:
    plugin = daemonset(render(*PLUGIN_ONLY, *syslog("/var/log/messages")), "device-plugin")
    args = assert_reads_the_file_unprivileged(plugin, "/var/log/messages")
    cfg = plugin_config.parse([a for a in args if a.startswith(("--kmsg-path", "--kernel-log-format"))], env={})
    assert (cfg.kernel_log_format, cfg.kmsg_path) == ("syslog", Path("/host/var/log/messages"))


def test_without_the_detector_the_dra_driver_reads_the_file_unprivileged() -> None:
    values = sets(npd__enabled=False, devicePlugin__enabled=False, draDriver__enabled=True)
    docs = render(*values, *syslog(), "--api-versions", "resource.k8s.io/v1")
    driver = daemonset(docs, "dra-driver")
    args = assert_reads_the_file_unprivileged(driver, "/var/log/kern.log")
    chosen = [a for a in args if a.startswith(("--kmsg-path", "--kernel-log-format"))]
    cfg = dra_config.parse([*chosen, "--node-name", "n"], env={})
    assert cfg.kernel_log_format == "syslog"


def test_no_pod_reading_the_file_is_privileged() -> None:
    for args in ([], PLUGIN_ONLY):
        for ds in of_kind(render(*args, *syslog()), "DaemonSet"):
            assert not container(ds)["securityContext"].get("privileged"), ds["metadata"]["name"]


@pytest.mark.parametrize("bad", ["kern.log", "/kern.log", "/var/log/", "/var/../etc/shadow", "relative/kern.log"])
def test_the_schema_refuses_a_path_that_is_no_file_below_a_directory(bad: str) -> None:
    assert "kernelLog" in refusal(*syslog(bad))
