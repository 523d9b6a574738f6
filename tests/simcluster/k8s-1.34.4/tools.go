//go:build tools

// A newer Kubernetes release than the test cluster's, for the scheduling simulation only (a
// private control plane: kube-apiserver and kube-scheduler): `make k8s-next` builds it into the
// cache beside the pinned one. Regenerate for another release with
// NEW_K8S_VERSION=vX.Y.Z K8S_MODULE_DIR=tests/simcluster/k8s-next tests/cluster/build-k8s.sh --regenerate
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
