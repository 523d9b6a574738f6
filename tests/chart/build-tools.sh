#!/usr/bin/env bash
# Builds the chart checks' tools from pinned Go modules into a cache outside the clone (seconds
# once cached, about a minute cold):
#   ct                 chart-testing, from tests/chart/tools/ct/go.mod, with its own etc/ linter files
#   kubectl-validate   SIG CLI's offline validator (the API server's own schema validation), from
#                      tests/chart/tools/kubectl-validate/go.mod; it embeds Kubernetes 1.30's schemas
#   openapi/<k8s>      the OpenAPI v3 documents of the newest Kubernetes release this repository pins
#                      (tests/cluster/k8s), laid out as kubectl-validate's --local-schemas wants
#   crds/              the CRDs of the optional objects the chart renders: Prometheus operator and
#                      node-feature-discovery from their Go modules at pinned versions (NFD's pin is the
#                      one tests/nfd builds the real nfd-master and nfd-worker from), and Kernel Module
#                      Management's Module CRD, vendored in tests/chart/kmm-crds/$KMM_VERSION/ because the Go
#                      module proxy refuses KMM's module (see the README there)
# Prints, on its last line, the directory of the paths.env that names them.
set -euo pipefail
cd "$(dirname "$0")"
HERE=$PWD
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/neuron-helm-chart/chart-tools"
PROMETHEUS_OPERATOR=github.com/prometheus-operator/prometheus-operator@v0.85.0
KMM_VERSION=v2.6.0
log() { printf '[chart-tools] %s\n' "$*" >&2; }
pin() { sed -n "s#^require $1 \(v[0-9.]*\)\$#\1#p" "$2"; }
module_dir() { (cd / && GOFLAGS= go mod download -json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'); }

CT_VERSION=$(pin github.com/helm/chart-testing/v3 tools/ct/go.mod)
KV_VERSION=$(pin sigs.k8s.io/kubectl-validate tools/kubectl-validate/go.mod)
K8S_VERSION=$(pin k8s.io/kubernetes ../cluster/k8s/go.mod)
NFD_VERSION=$(pin sigs.k8s.io/node-feature-discovery ../nfd/tools/go.mod)
[ -n "$CT_VERSION" ] && [ -n "$KV_VERSION" ] && [ -n "$K8S_VERSION" ] && [ -n "$NFD_VERSION" ] || { log "cannot read the pins"; exit 1; }
NFD=sigs.k8s.io/node-feature-discovery@$NFD_VERSION
KMM_CRDS_SRC=$HERE/kmm-crds/$KMM_VERSION
# Module is the only KMM kind the chart renders
KMM_CRD=$KMM_CRDS_SRC/kmm.sigs.x-k8s.io_modules.yaml
[ -f "$KMM_CRD" ] || { log "KMM $KMM_VERSION's Module CRD is not in $KMM_CRDS_SRC (kmm-crds/README.md)"; exit 1; }
# the cache follows the vendored file's content, not only its version directory
KMM_KEY=$KMM_VERSION-$(sha256sum "$KMM_CRD" | cut -c1-12)

build() {  # module-dir package output version
  [ -x "$3" ] && return 0
  log "building $2 $4 (cached afterwards)"
  mkdir -p "$(dirname "$3")"
  (cd "$1" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w $5" -o "$3.tmp" "$2")
  mv "$3.tmp" "$3"
}

ct_dir="$CACHE/ct-$CT_VERSION"
build tools/ct github.com/helm/chart-testing/v3/ct "$ct_dir/ct" "$CT_VERSION" \
  "-X github.com/helm/chart-testing/v3/ct/cmd.Version=$CT_VERSION"
if [ ! -f "$ct_dir/etc/lintconf.yaml" ]; then
  src=$(module_dir "github.com/helm/chart-testing/v3@$CT_VERSION")
  mkdir -p "$ct_dir/etc" && cp "$src/etc/chart_schema.yaml" "$src/etc/lintconf.yaml" "$ct_dir/etc/"
fi

build tools/kubectl-validate sigs.k8s.io/kubectl-validate "$CACHE/kubectl-validate-$KV_VERSION/kubectl-validate" "$KV_VERSION" ""

openapi="$CACHE/openapi/$K8S_VERSION"
if [ ! -f "$openapi/.complete" ]; then
  log "extracting Kubernetes $K8S_VERSION's OpenAPI v3 documents"
  src=$(module_dir "k8s.io/kubernetes@$K8S_VERSION")/api/openapi-spec/v3
  rm -rf "$openapi" && mkdir -p "$openapi"
  for f in "$src"/api*__*_openapi.json; do
    # api__v1_openapi.json -> api/v1.json; apis__apps__v1_openapi.json -> apis/apps/v1.json
    rel=$(basename "$f" _openapi.json | sed 's#__#/#g')
    # a group's discovery document (apis__apps_openapi.json -> apis/apps) is not a schema
    [[ "$rel" == apis/* && "$rel" != apis/*/* ]] && continue
    mkdir -p "$openapi/$(dirname "$rel")" && cp "$f" "$openapi/$rel.json"
  done
  touch "$openapi/.complete"
fi

crds="$CACHE/crds/${PROMETHEUS_OPERATOR##*@}-$NFD_VERSION-kmm-$KMM_KEY"
if [ ! -f "$crds/.complete" ]; then
  log "collecting the CRDs of $PROMETHEUS_OPERATOR, $NFD and KMM $KMM_VERSION"
  # collected aside and moved in whole: another clone may be reading or collecting the same directory
  tmp="$crds.tmp.$$" && rm -rf "$tmp" && mkdir -p "$tmp"
  po=$(module_dir "$PROMETHEUS_OPERATOR")/example/prometheus-operator-crd
  for kind in servicemonitors podmonitors prometheusrules; do cp "$po/monitoring.coreos.com_$kind.yaml" "$tmp/"; done
  cp "$(module_dir "$NFD")/deployment/base/nfd-crds/nfd-api-crds.yaml" "$tmp/nfd-api-crds.yaml"
  cp "$KMM_CRD" "$tmp/"
  touch "$tmp/.complete"
  [ -f "$crds/.complete" ] || rm -rf "$crds"  # half collected by an interrupted build
  mv -T "$tmp" "$crds" 2>/dev/null || rm -rf "$tmp"  # another clone's build was first
fi

# paths.env lives in a directory named by its content: clones with other pins or other vendored CRDs share the
# cache, and one clone's build must not change what another clone's tests read
paths=$(cat <<EOF
CT=$ct_dir/ct
CT_ETC=$ct_dir/etc
KUBECTL_VALIDATE=$CACHE/kubectl-validate-$KV_VERSION/kubectl-validate
OPENAPI_NEWEST=$openapi
OPENAPI_NEWEST_VERSION=${K8S_VERSION#v}
CRDS=$crds
NFD_VERSION=$NFD_VERSION
KMM_VERSION=$KMM_VERSION
EOF
)
env_dir="$CACHE/env/$(printf '%s\n' "$paths" | sha256sum | cut -c1-16)"
if [ ! -f "$env_dir/paths.env" ]; then
  mkdir -p "$env_dir" && printf '%s\n' "$paths" > "$env_dir/paths.env.$$" && mv "$env_dir/paths.env.$$" "$env_dir/paths.env"
fi
log "tools cached in $CACHE (paths in $env_dir/paths.env)"
echo "$env_dir"
