package main

// The agent: the node object, virtual-kubelet's node and pod controllers around our provider,
// and the kubelet HTTP API (container logs, exec) that the API server proxies to.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
)

// Label and taint that keep ordinary pods off the real node: a test opts in with a node
// selector and a toleration.
const (
	nodeRoleKey   = "pgkube.io/testbed-node"
	nodeRoleValue = "local"
)

type agent struct {
	cfg      config
	client   kubernetes.Interface
	provider *provider
	port     int32
}

func newAgent(ctx context.Context, cfg config) (*agent, error) {
	restConfig, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", cfg.kubeconfig, err)
	}
	restConfig.QPS, restConfig.Burst = 50, 100
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return nil, err
	}
	if _, err := parseTaint(cfg.extraTaint); err != nil {
		return nil, fmt.Errorf("--extra-taint: %w", err)
	}
	_, portText, err := net.SplitHostPort(cfg.listenAddr)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: %w", cfg.listenAddr, err)
	}
	port, err := strconv.ParseInt(portText, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: %w", cfg.listenAddr, err)
	}
	p, err := newProvider(ctx, cfg, client)
	if err != nil {
		return nil, err
	}
	return &agent{cfg: cfg, client: client, provider: p, port: int32(port)}, nil
}

func (a *agent) run(ctx context.Context) error {
	// Pods bound to this node only; Services everywhere, for the pods' name resolution.
	podInformers := informers.NewSharedInformerFactoryWithOptions(a.client, time.Minute,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", a.cfg.nodeName).String()
		}))
	otherInformers := informers.NewSharedInformerFactory(a.client, time.Minute)
	podInformer := podInformers.Core().V1().Pods()
	serviceInformer := otherInformers.Core().V1().Services()
	secretInformer := otherInformers.Core().V1().Secrets()
	configMapInformer := otherInformers.Core().V1().ConfigMaps()
	a.provider.watchServices(serviceInformer)
	a.provider.watchObjects(secretInformer, configMapInformer)
	// The pods of the other real nodes, for names that resolve across nodes.
	var peerInformers []informers.SharedInformerFactory
	for _, peer := range a.cfg.peerNodes {
		factory := informers.NewSharedInformerFactoryWithOptions(a.client, time.Minute,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", peer).String()
			}))
		a.provider.watchPeerPods(peer, factory.Core().V1().Pods())
		peerInformers = append(peerInformers, factory)
	}

	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&corev1client.EventSinkImpl{Interface: a.client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: a.cfg.nodeName})
	a.provider.recorder = recorder

	podController, err := node.NewPodController(node.PodControllerConfig{
		PodClient:         statusOnlyPods{a.client.CoreV1()},
		PodInformer:       podInformer,
		EventRecorder:     recorder,
		Provider:          a.provider,
		SecretInformer:    secretInformer,
		ConfigMapInformer: configMapInformer,
		ServiceInformer:   serviceInformer,
		// The provider resolves env itself: status.podIP is only known once it assigns one.
		SkipDownwardAPIResolution: true,
	})
	if err != nil {
		return err
	}
	nodeController, err := node.NewNodeController(node.NewNaiveNodeProvider(), a.nodeObject(),
		a.client.CoreV1().Nodes(),
		node.WithNodeEnableLeaseV1(a.client.CoordinationV1().Leases(corev1.NamespaceNodeLease), int32(a.cfg.leaseDuration)))
	if err != nil {
		return err
	}

	stopHTTP, err := a.serveKubeletAPI()
	if err != nil {
		return err
	}
	defer stopHTTP()

	podInformers.Start(ctx.Done())
	otherInformers.Start(ctx.Done())
	for _, factory := range peerInformers {
		factory.Start(ctx.Done())
	}
	defer a.provider.stopAll()
	go func() {
		if err := podController.Run(ctx, 8); err != nil && ctx.Err() == nil {
			log.Printf("pod controller stopped: %v", err)
		}
	}()
	select {
	case <-podController.Ready():
	case <-podController.Done():
		return fmt.Errorf("pod controller: %w", podController.Err())
	case <-ctx.Done():
		return nil
	}
	go func() {
		if err := nodeController.Run(ctx); err != nil && ctx.Err() == nil {
			log.Printf("node controller stopped: %v", err)
		}
	}()
	log.Printf("node %s registered; kubelet API on %s", a.cfg.nodeName, a.cfg.listenAddr)
	select {
	case <-ctx.Done():
		log.Printf("stopping: terminating every pod's processes")
		return nil
	case <-podController.Done():
		return fmt.Errorf("pod controller: %w", podController.Err())
	}
}

// nodeObject is the Node as registered: tainted and labelled so that only pods that ask for
// real processes land here, with this machine's CPU and memory.
func (a *agent) nodeObject() *corev1.Node {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(totalMemoryBytes(), resource.BinarySI),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: a.cfg.nodeName,
			Labels: map[string]string{
				"kubernetes.io/hostname": a.cfg.nodeName,
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     runtime.GOARCH,
				"type":                   "local",
				nodeRoleKey:              nodeRoleValue,
			},
		},
		Spec: corev1.NodeSpec{Taints: a.taints()},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity,
			Phase:       corev1.NodeRunning,
			// Only an InternalIP: the API server dials the first preferred address type it
			// finds, and a Hostname address would not resolve.
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{
				KubeletEndpoint: corev1.DaemonEndpoint{Port: a.port},
			},
			NodeInfo: corev1.NodeSystemInfo{
				OperatingSystem: "linux",
				Architecture:    runtime.GOARCH,
				KubeletVersion:  "v0.0.0-testbed-node",
			},
			Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "testbed-node is running pods as local processes"},
				{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory"},
				{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure"},
				{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID"},
				{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse, Reason: "RouteCreated"},
			},
		},
	}
}

// taints: the test bed's own, and --extra-taint (checked when the agent starts).
func (a *agent) taints() []corev1.Taint {
	taints := []corev1.Taint{{Key: nodeRoleKey, Value: nodeRoleValue, Effect: corev1.TaintEffectNoSchedule}}
	if extra, err := parseTaint(a.cfg.extraTaint); err == nil && extra != nil {
		taints = append(taints, *extra)
	}
	return taints
}

// parseTaint reads key=value:Effect; nil for "".
func parseTaint(text string) (*corev1.Taint, error) {
	if text == "" {
		return nil, nil
	}
	keyValue, effect, ok := strings.Cut(text, ":")
	key, value, _ := strings.Cut(keyValue, "=")
	if !ok || key == "" || effect == "" {
		return nil, fmt.Errorf("taint %q is not key=value:Effect", text)
	}
	return &corev1.Taint{Key: key, Value: value, Effect: corev1.TaintEffect(effect)}, nil
}

// serveKubeletAPI serves /containerLogs and /exec over TLS on loopback. Only clients with a
// certificate from the test bed's CA (the API server's kubelet client certificate) get in.
func (a *agent) serveKubeletAPI() (func(), error) {
	cert, err := tls.LoadX509KeyPair(a.cfg.tlsCert, a.cfg.tlsKey)
	if err != nil {
		return nil, fmt.Errorf("loading the kubelet API certificate: %w", err)
	}
	caPEM, err := os.ReadFile(a.cfg.clientCA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s holds no PEM certificate", a.cfg.clientCA)
	}
	mux := http.NewServeMux()
	api.AttachPodRoutes(api.PodHandlerConfig{
		GetContainerLogs: a.provider.containerLogs,
		RunInContainer:   a.provider.runInContainer,
		GetPods:          a.provider.GetPods,
	}, mux, false)
	listener, err := tls.Listen("tcp", a.cfg.listenAddr, &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS12,
	})
	if err != nil {
		return nil, fmt.Errorf("kubelet API listener: %w", err)
	}
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 30 * time.Second}
	go func() { _ = server.Serve(listener) }()
	return func() { _ = server.Close() }, nil
}

// totalMemoryBytes reads MemTotal from /proc/meminfo (0 if unreadable).
func totalMemoryBytes() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var kib int64
	if _, err := fmt.Sscanf(string(data), "MemTotal: %d kB", &kib); err != nil {
		return 0
	}
	return kib * 1024
}
