//go:build tools

// Package tools pins node-feature-discovery's master and worker so `go build` can compile them from this module.
package tools

import (
	_ "sigs.k8s.io/node-feature-discovery/cmd/nfd-master"
	_ "sigs.k8s.io/node-feature-discovery/cmd/nfd-worker"
)
