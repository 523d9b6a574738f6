//go:build tools

// Package tools pins kubectl-validate (SIG CLI's validator, which runs the API server's own schema
// validation offline) so `go build` can compile it from this module.
package tools

import _ "sigs.k8s.io/kubectl-validate"
