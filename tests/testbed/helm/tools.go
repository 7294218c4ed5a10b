//go:build tools

// Package tools pins helm, which the chart's tests (tests/helm_chart.rs) run against the test
// bed. It lives in its own module because helm pins other k8s.io library versions than the
// control plane, and its own cache key keeps a helm bump from rebuilding Kubernetes.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
