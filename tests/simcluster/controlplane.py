"""A private Kubernetes control plane for simulations: etcd and kube-apiserver on loopback.

Not the test cluster (tests/cluster/up.sh): no fixed port, no shared directory, no kubelet, no
controller manager. Everything lives in a scratch directory the caller owns, every port is picked
free on 127.0.0.1, and every process started here (the schedulers and the extender too, through
`Processes.start`) is stopped when the context exits, or killed with the harness if it dies
(setpriv --pdeathsig). The binaries are the ones tests/cluster/build-k8s.sh caches; etcd is Debian's.

Without a controller manager no node lifecycle controller watches node heartbeats, so Node objects
created Ready stay Ready; with the TaintNodesByCondition admission plugin off (that controller would
lift its not-ready taint) they are untainted: exactly what kube-scheduler sees of a healthy node.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from polling import until

REPO = Path(__file__).resolve().parents[2]
K8S_GO_MOD = REPO / "tests/cluster/k8s/go.mod"
STOP_GRACE = 10.0  # seconds between SIGTERM and SIGKILL


def k8s_version() -> str:
    """The pinned release (the test cluster's), or NEURON_SIM_K8S_VERSION: another release built
    into the same cache (`make k8s-next`), for the scheduling simulation's comparisons."""
    return os.environ.get("NEURON_SIM_K8S_VERSION") or _pinned(K8S_GO_MOD)


def _pinned(go_mod: Path) -> str:
    match = re.search(r"^require k8s.io/kubernetes (v[0-9.]+)$", go_mod.read_text(), re.MULTILINE)
    if not match:
        raise RuntimeError(f"{go_mod} pins no k8s.io/kubernetes version")
    return match.group(1)


def next_k8s_version() -> str:
    """The newer release of tests/simcluster/k8s-next (`make k8s-next`)."""
    return _pinned(REPO / "tests/simcluster/k8s-next/go.mod")


def older_k8s_versions() -> list[str]:
    """The older releases the DRA driver is tested on (tests/simcluster/k8s-1.*, `make k8s-versions`), oldest first."""
    found = [_pinned(d / "go.mod") for d in (REPO / "tests/simcluster").glob("k8s-1.*")]
    return sorted(found, key=lambda v: tuple(int(x) for x in v.removeprefix("v").split(".")))


@contextlib.contextmanager
def k8s_release(version: str) -> Iterator[None]:
    """Control planes started inside run `version` (its binaries must be built: `make k8s-next`)."""
    before = os.environ.get("NEURON_SIM_K8S_VERSION")
    os.environ["NEURON_SIM_K8S_VERSION"] = version
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("NEURON_SIM_K8S_VERSION", None)
        else:
            os.environ["NEURON_SIM_K8S_VERSION"] = before


def k8s_bin() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "neuron-helm-chart" / "k8s" / k8s_version() / "bin"


def missing_prerequisites() -> list[str]:
    """What `make setup` has not provided yet; empty when a control plane can start."""
    missing = [f"{k8s_bin()}/{b}" for b in ("kube-apiserver", "kube-scheduler") if not (k8s_bin() / b).exists()]
    missing += [tool for tool in ("etcd", "openssl", "setpriv") if shutil.which(tool) is None]
    return missing


def build_target() -> str:
    """The make target that builds this release's binaries (make setup builds the pinned and the older ones)."""
    version = k8s_version()
    if version == next_k8s_version() and version != _pinned(K8S_GO_MOD):
        return "make k8s-next"
    return "make setup" if version == _pinned(K8S_GO_MOD) else "make setup (or make k8s-versions)"


def require_prerequisites() -> None:
    """Fails the test that wants a control plane where `make setup` has not provided one: a tool
    missing is a broken set-up, never a skip (tests/skips.py)."""
    from skips import require

    require(missing_prerequisites(), build_target(), f"a Kubernetes {k8s_version()} control plane")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Processes:
    """The processes of one simulation, stopped in reverse order of start."""

    logs: Path
    running: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str | os.PathLike[str]], env: dict[str, str] | None = None) -> int:
        """Starts `argv` in its own session with output in logs/<name>.log; returns its pid.

        Call it from the event loop's thread: the death signal follows the thread that forked."""
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(
                # util-linux's setpriv sets PR_SET_PDEATHSIG and execs: no Python between fork and exec
                ["setpriv", "--pdeathsig", "KILL", "--", *map(str, argv)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        self.running.append((name, proc))
        return proc.pid

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.running}

    def check(self) -> None:
        """Raises if a process has exited, with the end of its log."""
        for name, proc in self.running:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    def log_tail(self, name: str, size: int = 3000) -> str:
        try:
            return (self.logs / f"{name}.log").read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, name: str) -> None:
        for entry in [e for e in self.running if e[0] == name]:
            _stop(entry[1])
            self.running.remove(entry)

    def stop_all(self) -> None:
        while self.running:
            _stop(self.running.pop()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(STOP_GRACE)


@dataclass(frozen=True)
class Credentials:
    ca: Path
    client_cert: Path  # an admin (system:masters) client certificate
    client_key: Path

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


@dataclass(frozen=True)
class ControlPlane:
    dir: Path
    server: str  # https://127.0.0.1:<port>
    credentials: Credentials
    kubeconfig: Path  # admin, for the schedulers and the extender
    processes: Processes


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=30)


def _certificates(pki: Path) -> Credentials:
    """A CA, the API server's serving certificate and an admin client certificate (P-256: fast to make)."""
    pki.mkdir(parents=True)
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req", "-x509", *curve, "-keyout", pki / "ca.key", "-out", pki / "ca.crt", "-subj", "/CN=sim-ca", "-days", "2"
    )
    signed = ("-CA", pki / "ca.crt", "-CAkey", pki / "ca.key", "-days", "2")
    _openssl(
        "req", "-x509", *curve, *signed, "-keyout", pki / "apiserver.key", "-out", pki / "apiserver.crt",
        "-subj", "/CN=kube-apiserver", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        "-addext", "extendedKeyUsage=serverAuth",
    )  # fmt: skip
    _openssl(
        "req", "-x509", *curve, *signed, "-keyout", pki / "admin.key", "-out", pki / "admin.crt",
        "-subj", "/O=system:masters/CN=sim-admin", "-addext", "extendedKeyUsage=clientAuth",
    )  # fmt: skip
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", pki / "sa.key")
    _openssl("ec", "-in", pki / "sa.key", "-pubout", "-out", pki / "sa.pub")
    return Credentials(pki / "ca.crt", pki / "admin.crt", pki / "admin.key")


def _kubeconfig(path: Path, server: str, creds: Credentials) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "sim", "cluster": {"server": server, "certificate-authority": str(creds.ca)}}],
        "users": [{"name": "admin", "user": {"client-certificate": str(creds.client_cert), "client-key": str(creds.client_key)}}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "admin"}}],
        "current-context": "sim",
    }  # fmt: skip
    path.write_text(json.dumps(config, indent=1))
    return path


def _ready(port: int, path: str, context: ssl.SSLContext | None) -> bool:
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=2, context=context)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def wait_until_ready(
    processes: Processes, what: str, port: int, path: str, timeout: float, tls: ssl.SSLContext | None
) -> None:
    def ready() -> bool:
        processes.check()  # a process that died fails the wait at once, with its log
        return _ready(port, path, tls)

    until(ready, f"{what} ready on 127.0.0.1:{port}{path}", timeout, 0.2, TimeoutError)


async def start_controller_manager(
    cp: ControlPlane, controllers: Sequence[str], *, name: str = "kube-controller-manager", flags: Sequence[str] = ()
) -> None:
    """The pinned release's kube-controller-manager with only `controllers` running, started under
    `name` (its log's), returning once it serves /healthz. `flags`: more of its flags."""
    port = free_port()
    cp.processes.start(
        name,
        [
            k8s_bin() / "kube-controller-manager",
            f"--kubeconfig={cp.kubeconfig}",
            f"--controllers={','.join(controllers)}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--use-service-account-credentials=false",
            *flags,
        ],
    )
    unverified = ssl.create_default_context()  # its serving certificate is self-signed
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE
    await asyncio.to_thread(wait_until_ready, cp.processes, name, port, "/healthz", 60, unverified)


@contextlib.contextmanager
def control_plane(
    work: Path, *, ready_timeout: float = 120.0, apiserver_args: Sequence[str] = ()
) -> Iterator[ControlPlane]:
    """etcd and kube-apiserver in `work`, ready to serve; stopped (with everything else started
    through `processes`) on exit. `apiserver_args`: more flags (e.g. a feature gate off). Fails the
    test, naming what is missing and its make target, where the binaries are not built."""
    require_prerequisites()
    work.mkdir(parents=True, exist_ok=True)
    processes = Processes(work / "logs")
    try:
        creds = _certificates(work / "pki")
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        processes.start(
            "etcd",
            [
                "etcd", "--name", "sim", "--data-dir", work / "etcd", "--log-level", "warn",
                "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                "--initial-cluster", f"sim=http://127.0.0.1:{peer_port}",
            ],
        )  # fmt: skip
        wait_until_ready(processes, "etcd", etcd_port, "/health", 30, None)
        pki = work / "pki"
        processes.start(
            "kube-apiserver",
            [
                k8s_bin() / "kube-apiserver", f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={api_port}",
                f"--cert-dir={work / 'apiserver-certs'}", "--service-cluster-ip-range=10.97.0.0/24",
                "--authorization-mode=RBAC", f"--client-ca-file={creds.ca}",
                f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--endpoint-reconciler-type=none", "--profiling=false",
                # it taints every new Node not-ready until the node lifecycle controller, not run here, sees it Ready
                "--disable-admission-plugins=TaintNodesByCondition",
                *apiserver_args,
            ],
        )  # fmt: skip
        wait_until_ready(processes, "kube-apiserver", api_port, "/readyz", ready_timeout, creds.ssl_context())
        server = f"https://127.0.0.1:{api_port}"
        yield ControlPlane(work, server, creds, _kubeconfig(work / "admin.kubeconfig", server, creds), processes)
    except BaseException:
        for name, _ in processes.running:  # the scratch directory goes with the caller: show the logs now
            print(f"--- last lines of {name}'s log:\n{processes.log_tail(name)}", file=sys.stderr)
        raise
    finally:
        processes.stop_all()


@contextlib.contextmanager
def private_control_plane(prefix: str, *, apiserver_args: Sequence[str] = ()) -> Iterator[ControlPlane]:
    """A private control plane for a test module or session, in a fresh temporary directory
    removed afterwards; fails the test (naming what is missing) where `make setup` has not run."""
    import tempfile

    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with control_plane(work, apiserver_args=apiserver_args) as cp:
            yield cp
    finally:
        shutil.rmtree(work, ignore_errors=True)
