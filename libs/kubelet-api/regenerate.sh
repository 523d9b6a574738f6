#!/usr/bin/env bash
# `make protos`: copy the kubelet's .proto contracts from the pinned k8s.io/kubelet Go module
# (the same release as the test cluster) and regenerate the Python modules. Output is committed.
set -euo pipefail
cd "$(dirname "$0")"
KUBELET_MODULE_VERSION="${KUBELET_MODULE_VERSION:-v0.36.3}"   # k8s.io/kubelet for Kubernetes v1.36.3
PY="${PYTHON:-../../.venv/bin/python}"
export PATH="$(cd "$(dirname "$PY")" && pwd):$PATH"   # protoc-gen-mypy plugins live beside python

work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
(cd "$work" && go mod init protos >/dev/null 2>&1 && go mod download -json "k8s.io/kubelet@$KUBELET_MODULE_VERSION" > dl.json)
src=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["Dir"])' "$work/dl.json")

# upstream directory under pkg/apis -> Python package under kubelet_api (a module name has no "-")
for api in deviceplugin/v1beta1 podresources/v1 dra/v1 dra/v1beta1 pluginregistration/v1 dra-health/v1alpha1; do
  pkg="${api//-/_}"
  mkdir -p "src/kubelet_api/$pkg"
  install -m 0644 "$src/pkg/apis/$api/api.proto" "src/kubelet_api/$pkg/api.proto"
  "$PY" -m grpc_tools.protoc -I src \
    --python_out=src --grpc_python_out=src \
    --mypy_out=src --mypy_grpc_out=src \
    "src/kubelet_api/$pkg/api.proto"
  touch "src/kubelet_api/${pkg%%/*}/__init__.py" "src/kubelet_api/$pkg/__init__.py"
done
echo "k8s.io/kubelet $KUBELET_MODULE_VERSION" > src/kubelet_api/UPSTREAM
echo "regenerated from k8s.io/kubelet $KUBELET_MODULE_VERSION"
