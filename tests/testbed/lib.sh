# shellcheck shell=bash disable=SC2034 # the variables are used by the scripts that source this
# Shared by tests/testbed/up and tests/testbed/down: paths, versions, logging, process records.
#
# Layout:
#   <repo>/target/testbed/            state of the running test bed (never CARGO_TARGET_DIR)
#     env                             KEY='value' lines for tests and scripts
#     bin/                            symlinks to the cached binaries (bin/kubectl, ...)
#     pids/<component>.pid            PIDs of what `up` started; `down` stops exactly these
#     logs/<component>.log            one log per component
#   ${PGKUBE_CACHE_DIR:-~/.cache/pgkube}/testbed/   built binaries, shared by every clone

TESTBED_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$TESTBED_DIR/../.." && pwd)"
STATE="$REPO_ROOT/target/testbed"
LOGS="$STATE/logs"
PIDS="$STATE/pids"
CACHE="${PGKUBE_CACHE_DIR:-$HOME/.cache/pgkube}/testbed"

KUBERNETES_VERSION="v1.34.3"
GARAGE_VERSION="2.5.0"

# Test-only credentials of the local Garage server. Not secrets: the server listens on
# 127.0.0.1 only and lives as long as the test bed.
S3_KEY_NAME="pgkube-test"
S3_ACCESS_KEY="GK7e57b0a7d00000000000c0de"
S3_SECRET_KEY="5e1f7e57000000000000000000000000000000000000000000000000c0ffee01"
S3_BUCKET="pgkube-test"
S3_REGION="garage"

# Every component `up` starts, in start order; `down` stops them in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler provisioner kwok node node-b postgres garage)

log() { printf '[testbed %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

# Prints the end of a component's log and exits.
fail() {
    local component="$1"
    shift
    log "FAILED: $*"
    if [[ -f "$LOGS/$component.log" ]]; then
        log "errors in $LOGS/$component.log:"
        grep -iE 'panic|fatal|error|failed' "$LOGS/$component.log" | tail -n 8 | cut -c1-400 >&2 || true
        log "last lines of $LOGS/$component.log:"
        tail -n 25 "$LOGS/$component.log" | cut -c1-400 >&2
    fi
    exit 1
}

pid_of() { cat "$PIDS/$1.pid" 2>/dev/null || true; }

is_alive() {
    local pid
    pid="$(pid_of "$1")"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null
}

# Stamps the release into the binaries (what /version and `kubectl version` report); a plain
# `go build` of the modules would report v0.0.0-master.
KUBE_LDFLAGS="-X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION"
KUBE_LDFLAGS+=" -X k8s.io/component-base/version.gitMajor=1"
KUBE_LDFLAGS+=" -X k8s.io/component-base/version.gitMinor=34"
KUBE_LDFLAGS+=" -X k8s.io/component-base/version.gitTreeState=clean"
KUBE_LDFLAGS+=" -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION"
KUBE_LDFLAGS+=" -X k8s.io/client-go/pkg/version.gitMajor=1"
KUBE_LDFLAGS+=" -X k8s.io/client-go/pkg/version.gitMinor=34"

# Cache key of the upstream Go binaries (etcd, Kubernetes, kwok): the pinned module files, the
# link flags and the Go version, so a change to any of them builds into a new directory instead
# of reusing a stale binary. Our own Go programs have their own key (below), so changing them
# never rebuilds Kubernetes.
kube_cache_key() {
    local hash
    hash="$(cd "$TESTBED_DIR/kube" && {
        go version
        echo "$KUBE_LDFLAGS"
        cat go.mod go.sum kwok/go.mod kwok/go.sum
    } | sha256sum | cut -c1-12)"
    echo "k8s-$KUBERNETES_VERSION-$hash"
}

# helm, for the chart's tests: the version its module pins (helm/go.mod), stamped into the
# binary as helm's own release build does (a plain `go build` would report v4.3).
HELM_VERSION="$(awk '$1 == "require" && $2 == "helm.sh/helm/v4" { print $3 }' "$TESTBED_DIR/helm/go.mod")"
HELM_LDFLAGS="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
HELM_LDFLAGS+=" -X helm.sh/helm/v4/internal/version.gitTreeState=clean"

# Cache key of helm: its module files, link flags and the Go version. A key of its own, so a
# helm bump never rebuilds Kubernetes.
helm_cache_key() {
    local hash
    hash="$(cd "$TESTBED_DIR/helm" && {
        go version
        echo "$HELM_LDFLAGS"
        cat go.mod go.sum
    } | sha256sum | cut -c1-12)"
    echo "helm-$HELM_VERSION-$hash"
}

# promtool, for the alerts' tests (tests/monitoring.rs): the Prometheus module its module pins
# (promtool/go.mod, v0.3XY.Z for Prometheus 3.XY.Z), stamped with that release as Prometheus'
# own build does. `remove_all_sd` leaves out the cloud service discoveries promtool never uses
# here (their SDKs are most of the build).
PROMETHEUS_MODULE_VERSION="$(awk '$1 == "require" && $2 == "github.com/prometheus/prometheus" { print $3 }' "$TESTBED_DIR/promtool/go.mod")"
PROMETHEUS_VERSION="$(sed -E 's/^v0\.3([0-9][0-9])\.([0-9]+)$/3.\1.\2/' <<<"$PROMETHEUS_MODULE_VERSION")"
PROMTOOL_TAGS="remove_all_sd"
PROMTOOL_LDFLAGS="-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION"

# Cache key of promtool: its module files, build tags, link flags and the Go version. A key of
# its own, so a Prometheus bump rebuilds nothing else.
promtool_cache_key() {
    local hash
    hash="$(cd "$TESTBED_DIR/promtool" && {
        go version
        echo "$PROMTOOL_TAGS $PROMTOOL_LDFLAGS"
        cat go.mod go.sum
    } | sha256sum | cut -c1-12)"
    echo "promtool-$PROMETHEUS_VERSION-$hash"
}

# Cache key of the test bed's own programs: the storage provisioner, the node agent and its
# bind shim (sources, module files, Go and C compiler versions).
own_cache_key() {
    local hash
    hash="$(cd "$TESTBED_DIR" && {
        go version
        cc --version | head -n1
        cat kube/go.mod kube/go.sum kube/provisioner/*.go node/go.mod node/go.sum node/*.go node/bindshim/*.c
    } | sha256sum | cut -c1-12)"
    echo "own-$hash"
}
