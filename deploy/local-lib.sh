# shellcheck shell=bash disable=SC2034 # the variables are used by the scripts that source this
# Shared by deploy/local-up and deploy/local-down: where the demo lives, and how to find what
# local-up started (see docs/local-demo.md).

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# local-up's state: the manager's pid and log, the webhook's certificate, the test bed it used.
STATE="$REPO_ROOT/target/local-up"
# The demo's namespace. The manager watches it alone and the admission webhook is called for its
# clusters alone, so other namespaces (the tests', on the same test bed) are left to their own
# managers.
DEMO_NAMESPACE=pgkube-demo
# The label of a namespace that local-up created; local-down deletes no other.
DEMO_LABEL_KEY=app.kubernetes.io/created-by
DEMO_LABEL_VALUE=pgkube-local-up
# The manager's webhook (conversion and admission), on loopback.
WEBHOOK=127.0.0.1:18443
# The admission webhook's registration: not `pgkube`, the name the tests give theirs.
ADMISSION_NAME=pgkube-demo

log() { echo "==> $*"; }

# Prints the pid of the manager that local-up started, if it still runs: the pid recorded, if
# that process is a `pgkube run` serving the demo's webhook (a pid the system gave to another
# process since is never signalled).
manager_pid() {
  local pid
  pid="$(cat "$STATE/manager.pid" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null |
    grep -q -- " run .*--webhook-bind-address $WEBHOOK " || return 1
  echo "$pid"
}

# Stops the manager that local-up started, if it runs. It finishes its in-flight reconciles
# before it exits.
stop_manager() {
  local pid
  if pid="$(manager_pid)"; then
    log "stopping the manager (pid $pid)"
    kill -TERM "$pid"
    for _ in $(seq 1 60); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
  fi
  rm -f "$STATE/manager.pid"
}

# The pid of this checkout's test bed's API server: which test bed instance runs, if one does.
testbed_apiserver_pid() { cat "$REPO_ROOT/target/testbed/pids/kube-apiserver.pid" 2>/dev/null || true; }

# Loads a test bed's env file (KUBECONFIG, the S3 server...) and sets `kubectl`.
load_testbed_env() {
  set -a
  # shellcheck disable=SC1090
  source "$1"
  set +a
  kubectl="$PGKUBE_TESTBED_BIN/kubectl"
}
