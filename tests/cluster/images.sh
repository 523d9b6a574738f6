#!/usr/bin/env bash
# `make images`: builds every service image from its own Dockerfile with podman (rootful, runc)
# and imports it into the test cluster's containerd (k8s.io namespace).
#
# No registry serves images here, so the base image (Debian bookworm with Python 3.11) is made
# with debootstrap from the Debian mirror this machine's apt already uses, and cached outside
# the clone; Python wheels are prepared on the host with the machine's own pip settings and
# installed inside the build with no network. Each image is smoke-run (`--help`).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
CLUSTER_DIR="${CLUSTER_DIR:-$REPO/.run/cluster}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/images"
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' services/device-plugin/pyproject.toml)
BASE_IMAGE=localhost/neuron-base:bookworm-py311
SERVICES=(device-plugin node-metrics node-problem-detector)
SETUPTOOLS=setuptools==84.2.1   # the build backend the packages need, as a wheel for offline builds
PODMAN=(podman --runtime "$(command -v runc)" --cgroup-manager cgroupfs)
# podman's default ulimits exceed this host's hard limits, and raising one needs CAP_SYS_RESOURCE: pass lower ones
LIMITS=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
log() { printf '[images] %s\n' "$*"; }
[ "$(id -u)" -eq 0 ] || { echo "make images needs root (rootful podman)" >&2; exit 1; }
mkdir -p "$CACHE" build/wheels

# --- base image --------------------------------------------------------------------------------
base_tar="$CACHE/neuron-base-bookworm-py311.tar"
if ! "${PODMAN[@]}" image exists "$BASE_IMAGE"; then
  if [ ! -f "$base_tar" ]; then
    mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)
    [ -n "$mirror" ] || { echo "no Debian mirror found in this machine's apt sources" >&2; exit 1; }
    root=$(mktemp -d)
    log "debootstrap bookworm (minbase + python3) from the machine's Debian mirror (a few minutes, once)"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root/rootfs" "$mirror" >"$root/log" 2>&1 \
      || { tail -20 "$root/log" >&2; exit 1; }
    rm -rf "$root/rootfs/var/cache/apt/archives"/*.deb "$root/rootfs/var/lib/apt/lists"/*
    tar -C "$root/rootfs" -cf "$base_tar.tmp" .
    mv "$base_tar.tmp" "$base_tar"
    rm -rf "$root"
  fi
  log "importing $BASE_IMAGE"
  "${PODMAN[@]}" import --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' --change 'CMD ["python3"]' \
    "$base_tar" "$BASE_IMAGE" >/dev/null
fi

# --- wheels, with the machine's pip settings -----------------------------------------------------
stamp=$(cat constraints.txt libs/*/pyproject.toml services/*/pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat build/wheels/.stamp 2>/dev/null)" != "$stamp-$SETUPTOOLS" ]; then
  log "downloading wheels for the images"
  rm -f build/wheels/*.whl
  .venv/bin/pip download -q -d build/wheels --only-binary=:all: -c constraints.txt \
    grpcio protobuf aiohttp prometheus-client kubernetes pyyaml "$SETUPTOOLS"
  echo "$stamp-$SETUPTOOLS" > build/wheels/.stamp
fi

# --- smoke: the exporter image serves a simulated node's metrics ---------------------------------
smoke_exporter() {  # image
  local sim="${SIM_ROOT:-/var/lib/neuron-sim/node}" port=19840 name="neuron-smoke-$$"
  [ -e "$sim/.neuron-sim/state.json" ] || .venv/bin/neuron-sim create --instance-type trn1.32xlarge --root "$sim" >/dev/null
  "${PODMAN[@]}" run -d --rm --name "$name" "${LIMITS[@]}" --network host -v "$sim:$sim:ro" "$1" \
    --host-root "$sim" --listen "127.0.0.1:$port" --pod-resources-socket /nonexistent >/dev/null
  local ok=1
  for _ in $(seq 1 50); do
    if curl -sf "127.0.0.1:$port/metrics" | grep '^neuron_device_info{' >/dev/null; then ok=0; break; fi
    sleep 0.2
  done
  "${PODMAN[@]}" stop -t 5 "$name" >/dev/null 2>&1 || true
  return $ok
}

# --- service images ------------------------------------------------------------------------------
CTR_SOCK="$CLUSTER_DIR/containerd/containerd.sock"
for svc in "${SERVICES[@]}"; do
  image="localhost/neuron-helm-chart/$svc:$VERSION"
  log "building $image"
  "${PODMAN[@]}" build -q "${LIMITS[@]}" --network none --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    -f "services/$svc/Dockerfile" -t "$image" . >/dev/null
  command=$("${PODMAN[@]}" image inspect "$image" --format '{{index .Config.Entrypoint 0}}')
  "${PODMAN[@]}" run --rm "${LIMITS[@]}" --network none "$image" --help >/dev/null \
    || { echo "$image: '$command --help' failed" >&2; exit 1; }
  if [ "$svc" = node-metrics ]; then
    smoke_exporter "$image" || { echo "$image did not serve the simulated node's metrics" >&2; exit 1; }
  fi
  size=$("${PODMAN[@]}" image inspect "$image" --format '{{.Size}}')
  log "$image ok ($((size / 1024 / 1024)) MB)"
  if [ -S "$CTR_SOCK" ]; then
    archive="$CLUSTER_DIR/$svc.tar"
    "${PODMAN[@]}" save -q --format docker-archive -o "$archive" "$image"
    ctr --address "$CTR_SOCK" -n k8s.io images import "$archive" >/dev/null
    rm -f "$archive"
    log "imported into the cluster's containerd"
  fi
done
