//go:build tools

// Package tools pins promtool, the command this module builds, so `go mod tidy` keeps it.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
