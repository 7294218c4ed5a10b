// Command testbed-node is the test bed's real node: it registers the node `testbed-local` with
// the API server and runs the pods bound to it as local processes, reporting their lifecycle as
// a kubelet does. It is built on virtual-kubelet's node library (pod and node controllers, the
// kubelet HTTP API); this program is the provider behind it: images mapped to local programs,
// volumes as directories, one loopback address per pod, probes, restarts and termination.
//
// Run as root. `testbed-node container-init` is an internal mode: the re-executed helper that
// sets up a container's namespaces and mounts, then execs the container's program.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == containerInitArg {
		containerInit() // never returns
	}
	cfg := parseFlags()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintf(os.Stderr, "testbed-node: %v\n", err)
		os.Exit(1)
	}
}

// config is everything the agent is told on its command line.
type config struct {
	kubeconfig    string
	nodeName      string
	runtimeDir    string
	listenAddr    string
	tlsCert       string
	tlsKey        string
	clientCA      string
	apiHost       string
	apiPort       string
	podNetwork    string
	pgkubeBinary  string
	imagesDir     string
	postgresLibs  string
	leaseDuration int
	// peerNodes: the other real nodes of the test bed, whose pods' names this node's pods
	// resolve too.
	peerNodes []string
	// extraTaint: a taint besides the test bed's own, as key=value:Effect (a second node that
	// only pods tolerating it land on).
	extraTaint string
	// volumeSyncPeriod: how often Secret, ConfigMap, downward API and projected volumes are
	// compared with their sources (the kubelet's sync is about a minute; tests want seconds).
	volumeSyncPeriod time.Duration
}

func parseFlags() config {
	var c config
	flag.StringVar(&c.kubeconfig, "kubeconfig", "", "admin kubeconfig of the test bed's API server")
	flag.StringVar(&c.nodeName, "node-name", "testbed-local", "name of the node to register")
	flag.StringVar(&c.runtimeDir, "runtime-dir", "", "directory for pods' runtime files (must be traversable by any user)")
	flag.StringVar(&c.listenAddr, "listen", "127.0.0.1:10250", "address of the kubelet API (logs, exec)")
	flag.StringVar(&c.tlsCert, "tls-cert", "", "serving certificate of the kubelet API")
	flag.StringVar(&c.tlsKey, "tls-key", "", "key of the serving certificate")
	flag.StringVar(&c.clientCA, "client-ca", "", "CA that signs the API server's kubelet client certificate")
	flag.StringVar(&c.apiHost, "api-host", "127.0.0.1", "API server host that pods see as KUBERNETES_SERVICE_HOST")
	flag.StringVar(&c.apiPort, "api-port", "", "API server port that pods see as KUBERNETES_SERVICE_PORT")
	flag.StringVar(&c.podNetwork, "pod-network", "127.77", "first two octets of the pods' loopback addresses")
	flag.StringVar(&c.pgkubeBinary, "pgkube-binary", "", "the pgkube binary that pgkube's image runs")
	flag.StringVar(&c.imagesDir, "images-dir", "", "directory with the image entrypoints (postgres-entrypoint.sh)")
	flag.StringVar(&c.postgresLibs, "postgres-root", "/usr/lib/postgresql", "where PostgreSQL majors are installed")
	flag.IntVar(&c.leaseDuration, "lease-duration", 40, "node lease duration in seconds")
	peers := flag.String("peer-nodes", "", "comma-separated names of the test bed's other real nodes")
	flag.StringVar(&c.extraTaint, "extra-taint", "", "another taint of the node, key=value:Effect")
	flag.DurationVar(&c.volumeSyncPeriod, "volume-sync-period", 2*time.Second,
		"how often Secret, ConfigMap, downward API and projected volumes are refreshed from their sources (also at once on a change of a Secret or ConfigMap); 0 turns refreshes off")
	flag.Parse()
	for _, peer := range strings.Split(*peers, ",") {
		if peer = strings.TrimSpace(peer); peer != "" {
			c.peerNodes = append(c.peerNodes, peer)
		}
	}
	return c
}

func run(ctx context.Context, cfg config) error {
	for name, value := range map[string]string{
		"--kubeconfig": cfg.kubeconfig, "--runtime-dir": cfg.runtimeDir, "--tls-cert": cfg.tlsCert,
		"--tls-key": cfg.tlsKey, "--client-ca": cfg.clientCA, "--api-port": cfg.apiPort,
		"--images-dir": cfg.imagesDir,
	} {
		if value == "" {
			return fmt.Errorf("%s is required", name)
		}
	}
	if err := os.MkdirAll(cfg.runtimeDir, 0o711); err != nil {
		return err
	}
	agent, err := newAgent(ctx, cfg)
	if err != nil {
		return err
	}
	return agent.run(ctx)
}
