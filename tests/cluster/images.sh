#!/usr/bin/env bash
# tests/cluster/images.sh [--import|--import-only]: builds every service image from services/Dockerfile
# with podman (rootful, runc), smoke-runs each and prints their sizes (`make images-build`). With
# --import (`make images`, `make cluster-test`, `make demo`) it then imports them into the test
# cluster's containerd (k8s.io namespace), and fails at once when that cluster is not running.
# --import-only imports the last build's images (build/images.tsv) without building: a second
# cluster's containerd (tests/cluster/isolated.sh) gets the images the first one has.
# It is the one image build: `make release` (tools/release.py) runs it too, then pushes the images
# it lists in build/images.tsv (service, local name, image ID: the ID, since other builds on this
# machine may retag the local name meanwhile).
#
# No registry serves images here, so the base image (Debian bookworm with Python 3.11) is made
# with debootstrap from the Debian mirror this machine's apt already uses, and cached outside
# the clone under a name keyed by its recipe; Python wheels are prepared on the host with the
# machine's own pip settings and installed inside the build with no network.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
CLUSTER_DIR="${CLUSTER_DIR:-$REPO/.run/cluster}"
CTR_SOCK="$CLUSTER_DIR/containerd/containerd.sock"
CTR="$CLUSTER_DIR/containerd/bin/ctr"  # the cluster's own (up.sh links it)
# containerd 2.x's ctr repeats every server deprecation (this host's cgroup v1) on each call
export CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS=1
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/images"
SERVICES=()   # every directory under services/ with a pyproject.toml
for project in services/*/pyproject.toml; do SERVICES+=("$(basename "$(dirname "$project")")"); done
# The base's recipe; its cache key, so that a changed recipe never reuses an old base. binutils is
# for `strip`, in the build stage only: the images copy nothing of the base but what they run.
BASE_RECIPE=(--variant=minbase --include=python3,python3-venv,binutils bookworm)
BASE_KEY=$(printf '%s\n' "${BASE_RECIPE[@]}" | sha256sum | cut -c1-12)
BASE_IMAGE=localhost/neuron-base:bookworm-$BASE_KEY
podman_args() { sed -n "s/^$1: *//p" tools/podman.args; }  # the one list of podman's options
read -ra PODMAN <<< "podman $(podman_args global)"
read -ra LIMITS <<< "$(podman_args run)"
log() { printf '[images] %s\n' "$*"; }

import=0 build=1
case "${1:-}" in
  --import) import=1 ;;
  --import-only) import=1 build=0 ;;
  "") ;;
  *) echo "usage: $0 [--import|--import-only]" >&2; exit 2 ;;
esac
[ "$(id -u)" -eq 0 ] || { echo "building the images needs root (rootful podman)" >&2; exit 1; }
if [ "$import" = 1 ] && [ ! -S "$CTR_SOCK" ]; then
  echo "the test cluster is not running (no containerd socket at $CTR_SOCK): start it with" \
    "make cluster-up, or build without importing with make images-build" >&2
  exit 1
fi
mkdir -p "$CACHE" build/wheels
# one build at a time in a clone: two (a `make images` beside `make release`, say) would both write
# build/ and the tags
exec 9>build/.images.lock
flock 9

import_images() {  # into every node's containerd: the cluster's, and those of tests/cluster/nodes.sh's nodes
  local node_dir
  import_node
  [ -f "$CLUSTER_DIR/nodes.env" ] || return 0
  for node_dir in "$CLUSTER_DIR"/nodes/*/; do
    [ -S "$node_dir/containerd/containerd.sock" ] || continue
    log "into node $(basename "$node_dir")"
    # its containerd's socket is a path here too: no need to enter the node's namespaces
    CLUSTER_DIR=${node_dir%/} CTR_SOCK="${node_dir}containerd/containerd.sock" CTR="${node_dir}containerd/bin/ctr" import_node
  done
}
import_node() {  # what build/images.tsv lists, into $CLUSTER_DIR's containerd
  # $CLUSTER_DIR/imported/<service>: the image ID last imported into this cluster's containerd (whose
  # image store, like this record, outlives cluster-down); the same ID, still listed, is not imported again
  mkdir -p "$CLUSTER_DIR/imported"
  listed=$("$CTR" --address "$CTR_SOCK" -n k8s.io images ls -q)
  while IFS=$'\t' read -r -u 3 svc image iid; do  # the build's list; on fd 3, which podman and ctr cannot read
    if [ "$(cat "$CLUSTER_DIR/imported/$svc" 2>/dev/null)" = "$iid" ] && grep -qxF "$image" <<<"$listed"; then
      log "$image already in the cluster's containerd (image ID ${iid:7:12})"
      continue
    fi
    archive="$CLUSTER_DIR/$svc.tar"
    "${PODMAN[@]}" save -q --format docker-archive -o "$archive" "$image"
    "$CTR" --address "$CTR_SOCK" -n k8s.io images import "$archive" >/dev/null
    rm -f "$archive"
    echo "$iid" > "$CLUSTER_DIR/imported/$svc"
    log "$image imported into the cluster's containerd"
  done 3< build/images.tsv
  # the chart's second scheduler (scheduler.enabled): the cluster cannot pull registry.k8s.io
  CLUSTER_DIR=$CLUSTER_DIR tests/cluster/kube-scheduler-image.sh
}
if [ "$build" = 0 ]; then
  [ -f build/images.tsv ] || { echo "no build to import (build/images.tsv): run make images-build first" >&2; exit 1; }
  import_images
  exit 0
fi

# --- base image --------------------------------------------------------------------------------
base_tar="$CACHE/neuron-base-bookworm-$BASE_KEY.tar"
if ! "${PODMAN[@]}" image exists "$BASE_IMAGE"; then
  if [ ! -f "$base_tar" ]; then
    mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)
    [ -n "$mirror" ] || { echo "no Debian mirror found in this machine's apt sources" >&2; exit 1; }
    root=$(mktemp -d)
    log "debootstrap ${BASE_RECIPE[*]} from the machine's Debian mirror (a few minutes, once)"
    debootstrap "${BASE_RECIPE[@]}" "$root/rootfs" "$mirror" >"$root/log" 2>&1 \
      || { tail -20 "$root/log" >&2; exit 1; }
    rm -rf "$root/rootfs/var/cache/apt/archives"/*.deb "$root/rootfs/var/lib/apt/lists"/*
    tar -C "$root/rootfs" -cf "$base_tar.tmp" .
    mv "$base_tar.tmp" "$base_tar"
    rm -rf "$root"
  fi
  log "importing $BASE_IMAGE"
  "${PODMAN[@]}" import --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin' --change 'CMD ["python3"]' \
    "$base_tar" "$BASE_IMAGE" >/dev/null
fi

# --- wheels, with the machine's pip settings, exactly the lock's ---------------------------------
# services/image-wheels.lock names every third-party wheel the images install, by sha256
# (tools/image_wheels.py writes it); pip refuses a download whose digest differs, and the build
# stage refuses a wheel the lock does not list (services/verify_wheels.py).
.venv/bin/python tools/image_wheels.py check \
  || { echo "services/image-wheels.lock is stale: re-lock with python tools/image_wheels.py lock, review, commit" >&2; exit 1; }
# Downloaded once per lock into the cache outside the clone (pip took about 20 s of CPU for them),
# then copied into the build context.
stamp=$(sha256sum services/image-wheels.lock | cut -c1-16)
if [ "$(cat build/wheels/.stamp 2>/dev/null)" != "$stamp" ]; then
  wheels="$CACHE/wheels-$stamp"
  if [ ! -f "$wheels/.stamp" ]; then
    log "downloading the locked wheels for the images (hashes checked)"
    rm -rf "$wheels.tmp"
    .venv/bin/pip download -q -d "$wheels.tmp" --only-binary=:all: --no-deps --require-hashes \
      -r services/image-wheels.lock
    echo "$stamp" > "$wheels.tmp/.stamp"
    rm -rf "$wheels"
    mv "$wheels.tmp" "$wheels"
  fi
  rm -rf build/wheels
  cp -r "$wheels" build/wheels
fi
# Each service's third-party requirements: the build's dependency layer depends on this list and
# the wheels alone, so a change to the code leaves it cached (services/Dockerfile).
.venv/bin/python services/image_requirements.py --write build/image-deps

# --- smoke: an image, as its own user on a read-only root, serves what it should over a simulated node
# A node of its own: the cluster's simulated node needs real character devices (up.sh), and a
# smoke run must not create or change it.
SIM=$(mktemp -d /tmp/neuron-smoke-node.XXXXXX)
chmod 755 "$SIM"  # the exporter smoke-runs as nobody
trap 'rm -rf "$SIM"' EXIT
smoke_serves() {  # image url-path pattern [service flags...]: the pattern shows up at the path in 10 s
  local image=$1 path=$2 pattern=$3 port=19840 name="neuron-smoke-$$" ok=1
  shift 3
  [ -e "$SIM/.neuron-sim/state.json" ] \
    || .venv/bin/neuron-sim create --instance-type trn1.32xlarge --root "$SIM" --force >/dev/null
  # 9>&-: the container's conmon outlives this call and must not hold the build lock
  "${PODMAN[@]}" run -d --rm --name "$name" "${LIMITS[@]}" --network host --read-only -v "$SIM:$SIM:ro" --tmpfs /run \
    "$image" --host-root "$SIM" --listen "127.0.0.1:$port" --pod-resources-socket /nonexistent "$@" >/dev/null 9>&-
  for _ in $(seq 1 50); do
    if curl -sf "127.0.0.1:$port$path" | grep "$pattern" >/dev/null; then ok=0; break; fi
    sleep 0.2
  done
  [ $ok = 0 ] || "${PODMAN[@]}" logs "$name" 2>&1 | tail -5 >&2
  "${PODMAN[@]}" stop -t 5 "$name" >/dev/null 2>&1 || true
  return $ok
}

# --- service images ------------------------------------------------------------------------------
# Each service's [project] strings its labels carry, read in one process: service TAB name TAB version
# TAB description TAB licence.
declare -A NAME VERSION DESCRIPTION LICENSE
while IFS=$'\t' read -r svc name version description license; do
  NAME[$svc]=$name VERSION[$svc]=$version DESCRIPTION[$svc]=$description LICENSE[$svc]=$license
done < <(.venv/bin/python -c '
import sys, tomllib
for service in sys.argv[1:]:
    project = tomllib.load(open(f"services/{service}/pyproject.toml", "rb"))["project"]
    fields = [project["name"], project["version"], project["description"], project["license"]["text"]]
    assert not any(c in f for f in fields for c in "\t\n"), f"{service}: a tab or newline in {fields}"
    print(service, *fields, sep="\t")
' "${SERVICES[@]}")
# What this machine has built, smoke-run and labelled, by content, outside the clone: a fresh clone
# (CI's) finds an earlier clone's work. Every key is a hash of all that decides the result, or an
# image ID, which is one; each record holds the ID of an image that must still be in the store.
RECORDS="$CACHE/records"
mkdir -p "$RECORDS"
# An image that passed this script's smoke run ($RECORDS/smoked-<ID of the unlabelled build>-<hash of
# this script>) is not run again: the same ID is the same content, and a changed smoke run runs anew.
SMOKE_KEY=$(sha256sum tests/cluster/images.sh | cut -c1-12)
smoke() {  # service image content-ID
  local svc=$1 image=$2 iid=$3 command
  if [ -f "$RECORDS/smoked-${iid#sha256:}-$SMOKE_KEY" ]; then
    log "$image: smoke-run already passed (image ID ${iid:7:12})"
    return
  fi
  command=$("${PODMAN[@]}" image inspect "$image" --format '{{index .Config.Entrypoint 0}}')
  "${PODMAN[@]}" run --rm "${LIMITS[@]}" --network none --read-only "$image" --help >/dev/null \
    || { echo "$image: '$command --help' failed" >&2; exit 1; }
  case $svc in
    device-plugin)  # it discovers the devices, serves their sockets and tries to register them
      smoke_serves "$image" /metrics \
        '^neuron_device_plugin_registration_failures_total{resource="aws.amazon.com/neuroncore"}' \
        --device-plugin-path /run \
        || { echo "$image did not discover the simulated node's devices" >&2; exit 1; } ;;
    node-metrics)
      smoke_serves "$image" /metrics '^neuron_device_info{' \
        || { echo "$image did not serve the simulated node's metrics" >&2; exit 1; } ;;
    node-problem-detector)
      # its reporter, through neuron_common.kube (aiohttp, TLS), tries the API server: with no
      # network the try must fail as unreachable, counted, not crash
      "${PODMAN[@]}" run --rm "${LIMITS[@]}" --network none --read-only --entrypoint /opt/neuron/bin/python "$image" \
        -c 'import asyncio, logging
from neuron_common.kube import Api
from neuron_problem_detector import config
from neuron_problem_detector.reporter import Reporter
async def main() -> None:
    api = Api("https://127.0.0.1:1", timeout=5)
    reporter = Reporter(api, "smoke", "smoke", config.parse(["--node-name=smoke"], env={}))
    assert not await reporter.sync_once()
    await api.close()
    assert "ClientConnectorError" in reporter.api_errors, reporter.api_errors
logging.disable()
asyncio.run(main())' \
        || { echo "$image: the detector's reporter did not try the API server" >&2; exit 1; }
      # the chart's `helm test` pods run this image's Python as nobody, with the kubernetes client
      # (charts/neuron-helm-chart/files/helm_test.py), which the detector itself no longer imports
      "${PODMAN[@]}" run --rm "${LIMITS[@]}" --network none --read-only --user 65534:65534 \
        --entrypoint /opt/neuron/bin/python "$image" \
        -c 'import kubernetes.client, kubernetes.config, neuron_model.instance_types; kubernetes.client.CoreV1Api' \
        || { echo "$image: the helm test pods' imports failed" >&2; exit 1; } ;;
    remediation-controller)  # without an API server it cannot list the fleet: its modules must import
      "${PODMAN[@]}" run --rm "${LIMITS[@]}" --network none --read-only --entrypoint /opt/neuron/bin/python "$image" \
        -c 'import neuron_remediation.app, neuron_remediation.planner, neuron_common.leader, neuron_common.kube' \
        || { echo "$image: the controller's imports failed" >&2; exit 1; } ;;
    dra-driver)  # without a kubelet and an API server it cannot serve: every module and stub must import,
      # and the YAML parser neuron_common.kube reads a --kubeconfig with (imported only then)
      "${PODMAN[@]}" run --rm "${LIMITS[@]}" --network none --read-only --entrypoint /opt/neuron/bin/python "$image" \
        -c 'import neuron_dra_driver.app, neuron_common.kube, yaml, kubelet_api.dra.v1.api_pb2_grpc' \
        || { echo "$image: the driver's imports failed" >&2; exit 1; } ;;
  esac
  record "smoked-${iid#sha256:}-$SMOKE_KEY" "$iid"
}
revision=$(git rev-parse HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || revision="$revision-dirty"
commit_time=$(git log -1 --format=%ct HEAD)
# The time of the last commit that changed what the images are made of: the content build's
# timestamp, so that a commit that leaves libs/ and services/ alone (a chart, test or doc change)
# builds the very images, IDs and layers, of the one before, and finds them built and smoke-run.
inputs_time=$(git log -1 --format=%ct -- services libs constraints.txt)
source_url=$(git remote get-url origin 2>/dev/null | sed -E 's#//[^/@]*@#//#' || true)
: > build/images.tsv.tmp
EMPTY_CONTEXT=$(mktemp -d)  # the labelling step's build context: it copies nothing
trap 'rm -rf "$SIM" "$EMPTY_CONTEXT"' EXIT
# What one service's build can read: every file its COPY lines name (a superset of the context after
# .containerignore, whose ignored caches and tests are left out here too), the base image, the
# arguments. `make test` builds all five three times (the cluster's images, the release e2e, the
# demo) and podman 4.3 takes about 8 s for a build it finds wholly in its cache: with the same inputs,
# and the image they built still in the store, the build is not run again.
# The files are the same for every service: hashed once.
sources=$(
  find services/Dockerfile constraints.txt build/wheels build/image-deps libs services -type f \
    -not -path '*/tests/*' -not -path '*/__pycache__/*' -not -path '*.egg-info/*' -not -path '*/.pytest_cache/*' \
    -not -path '*/.mypy_cache/*' -not -path '*/.ruff_cache/*' -not -path '*/.hypothesis/*' -print0 \
    | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
)
base_id=$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$BASE_IMAGE")
hash_lines() { printf '%s\n' "$@" | sha256sum | cut -d' ' -f1; }
record() {  # record image-ID: written whole (another clone's images.sh may read it meanwhile)
  printf '%s\n' "$2" > "$RECORDS/$1.$$"
  mv "$RECORDS/$1.$$" "$RECORDS/$1"
}
recorded() {  # record: the image ID it holds, when that image is still in the store; nothing otherwise
  local iid
  iid=$(cat "$RECORDS/$1" 2>/dev/null) || return 0
  if "${PODMAN[@]}" image exists "$iid"; then echo "$iid"; fi
}
for svc in "${SERVICES[@]}"; do
  version=${VERSION[$svc]}
  image="localhost/neuron-helm-chart/$svc:$version"
  build_record="build-$svc-$(hash_lines "$svc" "$BASE_IMAGE" "$base_id" "$inputs_time" "${LIMITS[*]}" "$sources")"
  content=$(recorded "$build_record")
  if [ -n "$content" ]; then
    log "$image: its inputs are those of the build of ${content:7:12}, still in the store: not rebuilt"
  else
    log "building $image"
    # --timestamp: the inputs' commit time, not the build's, so that the same inputs build the same image
    if ! "${PODMAN[@]}" build "${LIMITS[@]}" --network none --timestamp "$inputs_time" \
        --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "SERVICE=$svc" --target "$svc" \
        --iidfile "build/image-$svc.content.iid" -f services/Dockerfile . >"build/image-$svc.log" 2>&1; then
      tail -40 "build/image-$svc.log" >&2
      echo "$image: build failed (whole log: build/image-$svc.log)" >&2
      exit 1
    fi
    content=$(cat "build/image-$svc.content.iid")
    record "$build_record" "$content"
  fi
  # The OCI labels in a step of their own, on the built image's layers, never from podman's cache:
  # podman 4.3 reused a cached image whatever its labels (LABEL with build arguments, or --label
  # flags, on the same layers), so an image built at one commit said another's revision and date.
  # Without the cache, --timestamp still makes the same commit's labelled image the same image ID;
  # this script's own record (keyed by the built image and every label) then skips the step.
  labels=(
    "org.opencontainers.image.title=${NAME[$svc]}"
    "org.opencontainers.image.description=${DESCRIPTION[$svc]}"
    "org.opencontainers.image.version=$version"
    "org.opencontainers.image.licenses=${LICENSE[$svc]}"
    "org.opencontainers.image.revision=$revision" "org.opencontainers.image.source=$source_url"
    "org.opencontainers.image.created=$(date -u -d "@$commit_time" +%Y-%m-%dT%H:%M:%SZ)"
  )
  label_record="labelled-$svc-$(hash_lines "$content" "$commit_time" "${labels[@]}")"
  iid=$(recorded "$label_record")
  if [ -n "$iid" ] && [ "$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$image" 2>/dev/null)" = "${iid#sha256:}" ]; then
    log "$image: labelled as before (image ID ${iid:7:12})"
  elif [ -n "$iid" ]; then
    "${PODMAN[@]}" tag "$iid" "$image"
    log "$image: labelled as before (image ID ${iid:7:12}), tagged again"
  else
    if ! printf 'FROM %s\n' "$content" | "${PODMAN[@]}" build --no-cache --network none --timestamp "$commit_time" \
        "${labels[@]/#/--label=}" --iidfile "build/image-$svc.iid" -t "$image" -f - "$EMPTY_CONTEXT" \
        >>"build/image-$svc.log" 2>&1; then
      tail -20 "build/image-$svc.log" >&2
      echo "$image: labelling failed (whole log: build/image-$svc.log)" >&2
      exit 1
    fi
    iid=$(cat "build/image-$svc.iid")
    record "$label_record" "$iid"
  fi
  smoke "$svc" "$image" "$content"  # the labels change nothing it runs
  printf '%s\t%s\t%s\n' "$svc" "$image" "$iid" >> build/images.tsv.tmp
  log "$image ok"
done
mv build/images.tsv.tmp build/images.tsv

[ "$import" = 0 ] || import_images

# MB as podman images counts them (10^6 bytes), uncompressed
printf '\n%-56s %8s  %s\n' IMAGE "SIZE MB" USER
mapfile -t images < <(cut -f2 build/images.tsv)
"${PODMAN[@]}" image inspect --format '{{.Size}} {{.Config.User}}' "${images[@]}" | paste -d' ' <(printf '%s\n' "${images[@]}") - \
  | awk '{printf "%-56s %8.1f  %s\n", $1, $2 / 1e6, ($3 == "" ? 0 : $3)}' | sort
