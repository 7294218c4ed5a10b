package main

// The virtual-kubelet provider: the set of pods this node runs, their addresses, and the
// callbacks through which virtual-kubelet learns their status.

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1informers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

type provider struct {
	cfg      config
	client   kubernetes.Interface
	recorder record.EventRecorder
	images   imageResolver
	shimPath string
	ctx      context.Context

	mu       sync.Mutex
	pods     map[string]*podRuntime // by namespace/name
	usedIPs  map[string]bool
	nextIP   int
	notify   func(*corev1.Pod)
	services []*corev1.Service
	// peerPods: the pods of the other real nodes, by node.
	peerPods map[string][]*corev1.Pod
	dnsDirty chan struct{}
	objects  *objectCache // set before any pod starts
	// shuttingDown: the agent is stopping; pods' processes stop but the pods stay in the API,
	// as when a kubelet stops.
	shuttingDown bool
}

func newProvider(ctx context.Context, cfg config, client kubernetes.Interface) (*provider, error) {
	shim := filepath.Join(cfg.runtimeDir, "bindshim.so")
	if _, err := os.Stat(shim); err != nil {
		return nil, fmt.Errorf("the bind shim %s is missing (tests/testbed/up builds it): %w", shim, err)
	}
	p := &provider{
		cfg:      cfg,
		client:   client,
		images:   imageResolver{cfg: cfg},
		shimPath: shim,
		ctx:      ctx,
		pods:     map[string]*podRuntime{},
		usedIPs:  map[string]bool{},
		peerPods: map[string][]*corev1.Pod{},
		nextIP:   2,
		notify:   func(*corev1.Pod) {},
		dnsDirty: make(chan struct{}, 1),
	}
	go p.dnsLoop(ctx)
	return p, nil
}

func podKey(namespace, name string) string { return namespace + "/" + name }

// allocateIP hands out the next free address of the pod network (first two octets from
// --pod-network), skipping .0 and .255 in the last octet.
func (p *provider) allocateIP() (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for tries := 0; tries < 65536; tries++ {
		n := p.nextIP
		p.nextIP = (p.nextIP + 1) % 65536
		if n%256 == 0 || n%256 == 255 {
			continue
		}
		ip := fmt.Sprintf("%s.%d.%d", p.cfg.podNetwork, n/256, n%256)
		if !p.usedIPs[ip] {
			p.usedIPs[ip] = true
			return ip, nil
		}
	}
	return "", fmt.Errorf("pod network %s.0.0/16 is full", p.cfg.podNetwork)
}

func (p *provider) releaseIP(ip string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.usedIPs, ip)
}

// CreatePod starts running a pod: it returns at once, the pod's goroutine does the work.
func (p *provider) CreatePod(_ context.Context, pod *corev1.Pod) error {
	key := podKey(pod.Namespace, pod.Name)
	p.mu.Lock()
	existing := p.pods[key]
	p.mu.Unlock()
	if existing != nil && existing.uid() == pod.UID {
		return nil
	}
	ip, err := p.allocateIP()
	if err != nil {
		return err
	}
	runtime := newPodRuntime(p, pod.DeepCopy(), ip)
	// A pod of the same name that was removed from the API before its processes were gone (a
	// forced deletion) stops first, and the new one starts only after it, so that two pods
	// never share a volume. The new one takes the name first: from then on the old one's
	// status no longer reaches the API (see podRuntime.changed).
	runtime.predecessor = existing
	p.mu.Lock()
	p.pods[key] = runtime
	p.mu.Unlock()
	if existing != nil {
		existing.terminate(gracePeriod(existing.snapshot()))
	}
	go runtime.run()
	return nil
}

// UpdatePod takes metadata changes: labels feed name resolution, labels and annotations the
// downward API volumes. virtual-kubelet calls it when a pod's labels, annotations, images,
// active deadline or tolerations change. Container changes are not applied to running
// processes.
func (p *provider) UpdatePod(ctx context.Context, pod *corev1.Pod) error {
	runtime := p.lookup(pod.Namespace, pod.Name)
	if runtime == nil || runtime.uid() != pod.UID {
		// Another pod under a known name: a new one.
		return p.CreatePod(ctx, pod)
	}
	runtime.updateSpec(pod)
	p.markDNSDirty()
	runtime.kickVolumes()
	return nil
}

// DeletePod starts the graceful termination of a pod's processes and returns; the pod reports
// its terminated containers and then removes itself from the API, as a kubelet does.
func (p *provider) DeletePod(_ context.Context, pod *corev1.Pod) error {
	runtime := p.lookup(pod.Namespace, pod.Name)
	if runtime == nil || runtime.uid() != pod.UID {
		return errdefs.NotFound("pod not running here")
	}
	runtime.terminate(gracePeriod(pod))
	return nil
}

// GetPod gives the pod running under this name. A pod that is stopping counts as gone:
// virtual-kubelet then creates a new pod of the same name instead of taking it for the old one.
func (p *provider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	if runtime := p.lookup(namespace, name); runtime != nil && !runtime.isStopping() {
		return runtime.snapshot(), nil
	}
	return nil, errdefs.NotFound("pod not running here")
}

func (p *provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

func (p *provider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pods := make([]*corev1.Pod, 0, len(p.pods))
	for _, runtime := range p.pods {
		pods = append(pods, runtime.snapshot())
	}
	return pods, nil
}

func (p *provider) NotifyPods(_ context.Context, notify func(*corev1.Pod)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notify = notify
}

func (p *provider) publish(pod *corev1.Pod) {
	p.mu.Lock()
	notify := p.notify
	p.mu.Unlock()
	notify(pod)
	p.markDNSDirty()
}

// isCurrent is whether runtime is the pod this node runs under its name.
func (p *provider) isCurrent(runtime *podRuntime) bool {
	pod := runtime.snapshot()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pods[podKey(pod.Namespace, pod.Name)] == runtime
}

func (p *provider) lookup(namespace, name string) *podRuntime {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pods[podKey(namespace, name)]
}

// forget removes a pod whose processes are all gone, then deletes it from the API server when
// it was being deleted there (the kubelet's last step of a graceful deletion).
func (p *provider) forget(runtime *podRuntime, deleteFromAPI bool) {
	pod := runtime.snapshot()
	p.mu.Lock()
	if p.pods[podKey(pod.Namespace, pod.Name)] == runtime {
		delete(p.pods, podKey(pod.Namespace, pod.Name))
	}
	p.mu.Unlock()
	p.releaseIP(runtime.ip)
	p.markDNSDirty()
	p.mu.Lock()
	shuttingDown := p.shuttingDown
	p.mu.Unlock()
	if !deleteFromAPI || shuttingDown {
		return
	}
	uid := pod.UID
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := p.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64),
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		log.Printf("pod %s/%s: removing it from the API server: %v", pod.Namespace, pod.Name, err)
	}
}

// stopAll kills every pod's processes when the agent stops: nothing outlives the node.
func (p *provider) stopAll() {
	p.mu.Lock()
	p.shuttingDown = true
	runtimes := make([]*podRuntime, 0, len(p.pods))
	for _, runtime := range p.pods {
		runtimes = append(runtimes, runtime)
	}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, runtime := range runtimes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.terminate(5 * time.Second)
			<-runtime.done
		}()
	}
	wg.Wait()
}

func (p *provider) watchServices(informer corev1informers.ServiceInformer) {
	lister := informer.Lister()
	refresh := func(any) {
		services, err := lister.List(everything())
		if err != nil {
			return
		}
		p.mu.Lock()
		p.services = services
		p.mu.Unlock()
		p.markDNSDirty()
	}
	_, _ = informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    refresh,
		UpdateFunc: func(_, obj any) { refresh(obj) },
		DeleteFunc: refresh,
	})
}

// watchPeerPods keeps the pods of node peer for name resolution.
func (p *provider) watchPeerPods(peer string, informer corev1informers.PodInformer) {
	lister := informer.Lister()
	refresh := func(any) {
		pods, err := lister.List(everything())
		if err != nil {
			return
		}
		p.mu.Lock()
		p.peerPods[peer] = pods
		p.mu.Unlock()
		p.markDNSDirty()
	}
	_, _ = informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    refresh,
		UpdateFunc: func(_, obj any) { refresh(obj) },
		DeleteFunc: refresh,
	})
}

// event records a pod Event the way a kubelet does.
func (p *provider) event(pod *corev1.Pod, eventType, reason, format string, args ...any) {
	if p.recorder == nil {
		return
	}
	ref := &corev1.ObjectReference{
		Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: types.UID(pod.UID),
	}
	p.recorder.Eventf(ref, eventType, reason, format, args...)
}

// minimumGracePeriod: as the kubelet, even a forced deletion (grace 0) gives the processes
// this long after SIGTERM.
const minimumGracePeriod = 2 * time.Second

func gracePeriod(pod *corev1.Pod) time.Duration {
	grace := 30 * time.Second
	switch {
	case pod.DeletionGracePeriodSeconds != nil:
		grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	case pod.Spec.TerminationGracePeriodSeconds != nil:
		grace = time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return max(grace, minimumGracePeriod)
}
