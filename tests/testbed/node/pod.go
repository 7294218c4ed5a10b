package main

// One pod's life on this node: its sandbox (directories, volumes, hosts file), init containers
// in order, then every container under its restart policy, and the status a kubelet would
// report at each step.

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

type podRuntime struct {
	p   *provider
	ip  string
	dir string

	// publishing makes taking a status and handing it to virtual-kubelet one step: without it,
	// a status taken before a change could be handed over after the status taken after it,
	// and virtual-kubelet keeps the last one it was given (a finished pod stayed Running).
	publishing sync.Mutex

	mu          sync.Mutex
	pod         *corev1.Pod
	init        []*containerRuntime
	main        []*containerRuntime
	initialized bool
	sandboxUp   bool
	finished    bool // every container is done for good (or the pod failed)
	terminating bool
	cleanedUp   bool
	grace       time.Duration
	stopping    chan struct{} // closed when termination starts
	done        chan struct{} // closed when no process of the pod is left
	// predecessor is an older pod of the same name still stopping; this one waits for it.
	predecessor *podRuntime
	// volumesDirty asks syncVolumes for a refresh now; volumeSync counts it while it runs.
	volumesDirty chan struct{}
	volumeSync   sync.WaitGroup
}

func newPodRuntime(p *provider, pod *corev1.Pod, ip string) *podRuntime {
	r := &podRuntime{
		p:            p,
		ip:           ip,
		dir:          filepath.Join(p.cfg.runtimeDir, "pods", string(pod.UID)),
		pod:          pod,
		stopping:     make(chan struct{}),
		done:         make(chan struct{}),
		volumesDirty: make(chan struct{}, 1),
	}
	for _, c := range pod.Spec.InitContainers {
		r.init = append(r.init, newContainerRuntime(r, c, true))
	}
	for _, c := range pod.Spec.Containers {
		r.main = append(r.main, newContainerRuntime(r, c, false))
	}
	now := metav1.Now()
	status := &pod.Status
	status.Phase = corev1.PodPending
	status.HostIP, status.HostIPs = "127.0.0.1", []corev1.HostIP{{IP: "127.0.0.1"}}
	status.PodIP, status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
	status.StartTime = &now
	return r
}

func (r *podRuntime) uid() types.UID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pod.UID
}

// snapshot is the pod with its current status, safe to hand out.
func (r *podRuntime) snapshot() *corev1.Pod {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.snapshotLocked()
}

func (r *podRuntime) snapshotLocked() *corev1.Pod {
	var initStatuses, statuses []corev1.ContainerStatus
	for _, c := range r.init {
		initStatuses = append(initStatuses, c.statusLocked())
	}
	allReady := len(r.main) > 0
	for _, c := range r.main {
		s := c.statusLocked()
		allReady = allReady && s.Ready
		statuses = append(statuses, s)
	}
	phase := r.phaseLocked()
	ready := allReady && phase == corev1.PodRunning
	// The conditions are kept on r.pod, so that a condition's lastTransitionTime stays the time
	// of its last change instead of the time of the snapshot.
	setCondition(&r.pod.Status, corev1.PodReadyToStartContainers, r.sandboxUp)
	setCondition(&r.pod.Status, corev1.PodInitialized, r.initialized)
	setCondition(&r.pod.Status, corev1.ContainersReady, ready)
	setCondition(&r.pod.Status, corev1.PodReady, ready)
	pod := r.pod.DeepCopy()
	pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses = initStatuses, statuses
	pod.Status.Phase = phase
	return pod
}

// phaseLocked follows the kubelet: Pending until a container has started, Running while any
// runs or will restart, then Succeeded when every container exited 0, else Failed.
func (r *podRuntime) phaseLocked() corev1.PodPhase {
	if r.finished {
		if !r.initialized {
			return corev1.PodFailed
		}
		for _, c := range r.main {
			if c.last == nil || c.last.ExitCode != 0 {
				return corev1.PodFailed
			}
		}
		return corev1.PodSucceeded
	}
	if !r.initialized {
		return corev1.PodPending
	}
	for _, c := range r.main {
		if c.everStarted {
			return corev1.PodRunning
		}
	}
	return corev1.PodPending
}

func setCondition(status *corev1.PodStatus, kind corev1.PodConditionType, value bool) {
	want := corev1.ConditionFalse
	if value {
		want = corev1.ConditionTrue
	}
	for i := range status.Conditions {
		if status.Conditions[i].Type == kind {
			if status.Conditions[i].Status != want {
				status.Conditions[i].Status = want
				status.Conditions[i].LastTransitionTime = metav1.Now()
			}
			return
		}
	}
	status.Conditions = append(status.Conditions, corev1.PodCondition{
		Type: kind, Status: want, LastTransitionTime: metav1.Now(),
	})
}

// changed publishes the current status to virtual-kubelet (and so to the API server). A pod
// that a newer pod of the same name has replaced keeps quiet: virtual-kubelet knows pods by
// name, and its status would land on the new pod.
func (r *podRuntime) changed() {
	r.publishing.Lock()
	defer r.publishing.Unlock()
	if !r.p.isCurrent(r) {
		return
	}
	r.p.publish(r.snapshot())
}

// update applies change under the pod's lock, then publishes the new status.
func (r *podRuntime) update(change func()) {
	r.mu.Lock()
	change()
	r.mu.Unlock()
	r.changed()
}

func (r *podRuntime) updateSpec(pod *corev1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pod.UID != r.pod.UID {
		return
	}
	r.pod.Labels = pod.Labels
	r.pod.Annotations = pod.Annotations
}

func (r *podRuntime) isStopping() bool {
	select {
	case <-r.stopping:
		return true
	default:
		return false
	}
}

// terminate starts a graceful stop: SIGTERM to every running container, SIGKILL after the
// grace period. Called again, it can only shorten the grace period.
func (r *podRuntime) terminate(grace time.Duration) {
	r.mu.Lock()
	if r.terminating {
		r.mu.Unlock()
		return
	}
	r.terminating = true
	r.grace = grace
	containers := append(append([]*containerRuntime{}, r.init...), r.main...)
	alreadyDone := r.finished
	close(r.stopping)
	r.mu.Unlock()
	for _, c := range containers {
		c.stop(grace, "the pod is being deleted")
	}
	if alreadyDone {
		// run() has ended; the pod only waited for its deletion.
		go r.cleanUp(true)
	}
}

// stopGrace is the grace period of the termination under way.
func (r *podRuntime) stopGrace() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.grace
}

// run is the pod's whole life.
func (r *podRuntime) run() {
	pod := r.snapshot()
	r.changed()
	if r.predecessor != nil {
		select {
		case <-r.predecessor.done:
		case <-r.stopping:
			r.finish()
			return
		}
	}
	if err := r.prepareSandbox(); err != nil {
		if !r.isStopping() {
			log.Printf("pod %s/%s: %v", pod.Namespace, pod.Name, err)
		}
		r.finish()
		return
	}
	r.update(func() { r.sandboxUp = true })
	r.volumeSync.Add(1)
	go r.syncVolumes()

	if !r.runInitContainers() {
		r.finish()
		return
	}
	r.update(func() { r.initialized = true })

	var wg sync.WaitGroup
	for _, c := range r.main {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.supervise(restartPolicyFor(pod, c))
		}()
	}
	wg.Wait()
	r.finish()
}

// runInitContainers runs them one after the other; false when the pod cannot go on.
func (r *podRuntime) runInitContainers() bool {
	pod := r.snapshot()
	for _, c := range r.init {
		if c.spec.RestartPolicy != nil && *c.spec.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			c.fail("Unsupported", "sidecar init containers (restartPolicy: Always) are not supported by the test bed node")
			return false
		}
		policy := pod.Spec.RestartPolicy
		if policy == corev1.RestartPolicyAlways {
			policy = corev1.RestartPolicyOnFailure
		}
		if !c.supervise(policy) {
			return false
		}
	}
	return !r.isStopping()
}

// finish records that no container will run again, then waits for the pod's deletion (or
// cleans up now if it is already being deleted).
func (r *podRuntime) finish() {
	r.mu.Lock()
	r.finished = true
	terminating := r.terminating
	r.mu.Unlock()
	r.changed()
	if terminating {
		r.cleanUp(true)
	}
}

// cleanUp removes the pod's runtime files and forgets it; deleteFromAPI finishes a deletion.
// Only the first call does anything.
func (r *podRuntime) cleanUp(deleteFromAPI bool) {
	r.mu.Lock()
	already := r.cleanedUp
	r.cleanedUp = true
	r.mu.Unlock()
	if already {
		return
	}
	// The last status (terminated containers, final phase) goes out before the object goes.
	r.changed()
	time.Sleep(200 * time.Millisecond)
	// The volume sync ends with the pod's stopping (which precedes every clean-up); a refresh
	// under way finishes before the files go.
	r.volumeSync.Wait()
	if err := os.RemoveAll(r.dir); err != nil {
		log.Printf("removing %s: %v", r.dir, err)
	}
	close(r.done)
	r.p.forget(r, deleteFromAPI)
}

func restartPolicyFor(pod *corev1.Pod, c *containerRuntime) corev1.RestartPolicy {
	if c.spec.RestartPolicy != nil {
		return corev1.RestartPolicy(*c.spec.RestartPolicy)
	}
	if pod.Spec.RestartPolicy == "" {
		return corev1.RestartPolicyAlways
	}
	return pod.Spec.RestartPolicy
}

// waitOrStop sleeps for d, or less if the pod starts stopping; false when it did.
func (r *podRuntime) waitOrStop(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-r.stopping:
		return false
	}
}

func (r *podRuntime) event(eventType, reason, format string, args ...any) {
	r.p.event(r.snapshot(), eventType, reason, format, args...)
}

func (r *podRuntime) String() string {
	pod := r.snapshot()
	return fmt.Sprintf("%s/%s", pod.Namespace, pod.Name)
}

func (r *podRuntime) context() context.Context { return r.p.ctx }
