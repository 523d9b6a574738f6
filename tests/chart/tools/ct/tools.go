//go:build tools

// Package tools pins chart-testing (ct) so `go build` can compile it from this module.
package tools

import _ "github.com/helm/chart-testing/v3/ct"
