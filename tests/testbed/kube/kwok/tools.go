//go:build tools

// Package tools pins kwok, which simulates nodes and pod lifecycles for the test bed. It lives in
// its own module because kwok pins different k8s.io library versions than the control plane.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
