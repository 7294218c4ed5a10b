package main

// One container of a pod: starting its process from the image mapping and the pod spec,
// restarting it under the restart policy with the kubelet's back-off, stopping it gracefully,
// and its ContainerStatus.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	initialBackOff = 10 * time.Second
	maxBackOff     = 5 * time.Minute
	// A container that ran this long without failing starts its back-off afresh.
	backOffReset = 10 * time.Minute
	// The kubelet keeps at most this much of a termination message.
	maxTerminationMessage = 4096
	// FallbackToLogsOnError takes the end of the log: at most this many lines and bytes.
	fallbackLogLines = 80
	fallbackLogBytes = 2048
)

type containerRuntime struct {
	pod  *podRuntime
	spec corev1.Container
	init bool

	// Guarded by pod.mu.
	state       corev1.ContainerState
	last        *corev1.ContainerStateTerminated
	lastState   corev1.ContainerState
	restarts    int32
	ready       bool
	started     bool
	everStarted bool
	imageID     string
	containerID string
	proc        *process
}

// errConfig is a container that cannot be created from its spec yet (a missing Secret, say):
// it waits with CreateContainerConfigError and is tried again.
type errConfig struct{ message string }

func (e errConfig) Error() string { return e.message }

func newContainerRuntime(pod *podRuntime, spec corev1.Container, init bool) *containerRuntime {
	reason := "ContainerCreating"
	if !init && len(pod.pod.Spec.InitContainers) > 0 {
		reason = "PodInitializing"
	}
	return &containerRuntime{
		pod: pod, spec: spec, init: init,
		state: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}},
	}
}

func (c *containerRuntime) statusLocked() corev1.ContainerStatus {
	started := c.started
	return corev1.ContainerStatus{
		Name:                 c.spec.Name,
		Image:                c.spec.Image,
		ImageID:              c.imageID,
		ContainerID:          c.containerID,
		State:                *c.state.DeepCopy(),
		LastTerminationState: *c.lastState.DeepCopy(),
		Ready:                c.ready,
		Started:              &started,
		RestartCount:         c.restarts,
	}
}

func (c *containerRuntime) setWaiting(reason, message string) {
	c.pod.update(func() {
		c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}
		c.ready, c.started = false, false
	})
}

// fail ends a container that will never run, with a reason.
func (c *containerRuntime) fail(reason, message string) {
	c.pod.update(func() {
		c.last = &corev1.ContainerStateTerminated{ExitCode: 1, Reason: reason, Message: message, FinishedAt: metav1.Now()}
		c.state = corev1.ContainerState{Terminated: c.last}
	})
}

// supervise runs the container until its restart policy says it is done, or the pod stops.
// True when it last exited with 0.
func (c *containerRuntime) supervise(policy corev1.RestartPolicy) bool {
	backOff := time.Duration(0)
	for {
		if c.pod.isStopping() {
			return c.succeeded()
		}
		proc, err := c.start()
		var imageErr errImageNotMapped
		var configErr errConfig
		switch {
		case errors.As(err, &imageErr):
			c.setWaiting("ErrImagePull", imageErr.message)
			c.pod.event(corev1.EventTypeWarning, "Failed", "Failed to pull image %q: %s", c.spec.Image, imageErr.message)
			if !c.pod.waitOrStop(initialBackOff) {
				return false
			}
			continue
		case errors.As(err, &configErr):
			c.setWaiting("CreateContainerConfigError", configErr.message)
			c.pod.event(corev1.EventTypeWarning, "Failed", "Error: %s", configErr.message)
			if !c.pod.waitOrStop(2 * time.Second) {
				return false
			}
			continue
		case err != nil:
			c.terminated(&corev1.ContainerStateTerminated{
				ExitCode: 128, Reason: "StartError", Message: err.Error(),
				StartedAt: metav1.Now(), FinishedAt: metav1.Now(),
			})
			c.pod.event(corev1.EventTypeWarning, "Failed", "Error: %s", err)
		default:
			c.pod.event(corev1.EventTypeNormal, "Started", "Started container %s", c.spec.Name)
			go c.probe(proc)
			if c.pod.isStopping() {
				// The pod's deletion came while the process was starting, before it was there
				// to be signalled.
				proc.stop(c.pod.stopGrace())
			}
			c.terminated(proc.wait())
		}
		if c.pod.isStopping() || !shouldRestart(policy, c.succeeded()) {
			return c.succeeded()
		}
		backOff = nextBackOff(backOff, c.ranFor())
		if backOff > 0 {
			c.setWaiting("CrashLoopBackOff", fmt.Sprintf("back-off %s restarting failed container=%s pod=%s",
				backOff, c.spec.Name, c.pod.snapshot().Name))
			if !c.pod.waitOrStop(backOff) {
				return c.succeeded()
			}
		}
		c.pod.mu.Lock()
		c.restarts++
		c.pod.mu.Unlock()
	}
}

func shouldRestart(policy corev1.RestartPolicy, succeeded bool) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return !succeeded
	default:
		return true
	}
}

// nextBackOff: the first restart is immediate, then 10 s doubling up to 5 min; a container
// that ran for 10 minutes starts over.
func nextBackOff(previous, ranFor time.Duration) time.Duration {
	switch {
	case ranFor >= backOffReset:
		return 0
	case previous == 0:
		return time.Nanosecond
	case previous < initialBackOff:
		return initialBackOff
	default:
		return min(previous*2, maxBackOff)
	}
}

func (c *containerRuntime) succeeded() bool {
	c.pod.mu.Lock()
	defer c.pod.mu.Unlock()
	return c.last != nil && c.last.ExitCode == 0
}

func (c *containerRuntime) ranFor() time.Duration {
	c.pod.mu.Lock()
	defer c.pod.mu.Unlock()
	if c.last == nil {
		return 0
	}
	return c.last.FinishedAt.Sub(c.last.StartedAt.Time)
}

// terminated records an exit. It becomes the last state when the container starts again.
func (c *containerRuntime) terminated(state *corev1.ContainerStateTerminated) {
	c.pod.update(func() {
		state.ContainerID = c.containerID
		c.last = state
		c.state = corev1.ContainerState{Terminated: state}
		c.ready, c.started, c.proc = false, false, nil
	})
}

// start creates the container's process. Errors are errImageNotMapped, errConfig, or a
// failure to run the program (a start error).
func (c *containerRuntime) start() (*process, error) {
	image, err := c.pod.p.images.resolve(c.spec.Image)
	if err != nil {
		return nil, err
	}
	pod := c.pod.snapshot()
	env, err := resolveEnv(c.pod.context(), c.pod.p, pod, c.spec, image.env, c.pod.ip)
	if err != nil {
		return nil, errConfig{err.Error()}
	}
	argv := containerArgv(c.spec, image, env)
	if len(argv) == 0 {
		return nil, errConfig{"no command specified"}
	}
	user, err := containerUser(pod, c.spec, image)
	if err != nil {
		return nil, err
	}
	c.pod.mu.Lock()
	restart := c.restarts
	c.imageID = image.imageID
	c.containerID = fmt.Sprintf("testbed://%s/%s/%d", pod.UID, c.spec.Name, restart)
	c.pod.mu.Unlock()

	logFile, err := c.openLog(restart)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	termination, err := c.terminationFile(restart)
	if err != nil {
		return nil, err
	}
	mounts, err := c.pod.containerMounts(c.spec, image, termination)
	if err != nil {
		return nil, errConfig{err.Error()}
	}
	workDir := c.spec.WorkingDir
	if workDir == "" {
		workDir = image.workDir
	}
	spec := containerSpec{
		Argv: argv, Env: env, WorkDir: workDir, Hostname: c.pod.hostname(),
		UID: user.uid, GID: user.gid, Groups: user.groups, Mounts: mounts,
		NoNewPrivileges: noNewPrivileges(c.spec), ReadOnlyRoot: readOnlyRoot(c.spec),
	}
	proc, err := startProcess(spec, logFile, c.spec.Stdin)
	if err != nil {
		return nil, err
	}
	proc.terminationFile = termination
	proc.logPath = logFile.Name()
	proc.policy = c.spec.TerminationMessagePolicy
	c.pod.mu.Lock()
	if c.last != nil {
		c.lastState = corev1.ContainerState{Terminated: c.last}
	}
	c.proc = proc
	c.everStarted = true
	c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(proc.startedAt)}}
	c.pod.mu.Unlock()
	c.pod.changed()
	return proc, nil
}

// containerArgv applies Kubernetes' rules: command replaces the image's entrypoint (and drops
// its cmd), args replace the cmd; $(VAR) references expand from the container's env.
func containerArgv(spec corev1.Container, image imageConfig, env []string) []string {
	var argv []string
	switch {
	case len(spec.Command) > 0:
		argv = append(append(argv, spec.Command...), spec.Args...)
	case len(spec.Args) > 0:
		argv = append(append(argv, image.entrypoint...), spec.Args...)
	default:
		argv = append(append(argv, image.entrypoint...), image.cmd...)
	}
	vars := envMap(env)
	for i := range argv {
		argv[i] = expand(argv[i], vars)
	}
	return argv
}

func noNewPrivileges(spec corev1.Container) bool {
	sc := spec.SecurityContext
	return sc != nil && sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation
}

func readOnlyRoot(spec corev1.Container) bool {
	sc := spec.SecurityContext
	return sc != nil && sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
}

// stop sends SIGTERM, then SIGKILL after the grace period, to the running process if any.
func (c *containerRuntime) stop(grace time.Duration, why string) {
	c.pod.mu.Lock()
	proc := c.proc
	c.pod.mu.Unlock()
	if proc == nil {
		return
	}
	c.pod.event(corev1.EventTypeNormal, "Killing", "Stopping container %s: %s", c.spec.Name, why)
	proc.stop(grace)
}

func (c *containerRuntime) openLog(restart int32) (*os.File, error) {
	dir := filepath.Join(c.pod.dir, "logs", c.spec.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return os.OpenFile(filepath.Join(dir, fmt.Sprintf("%d.log", restart)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
}

// terminationFile is the file mounted at terminationMessagePath: writable by any user, as the
// kubelet makes it.
func (c *containerRuntime) terminationFile(restart int32) (string, error) {
	dir := filepath.Join(c.pod.dir, "termination")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%d", c.spec.Name, restart))
	if err := os.WriteFile(path, nil, 0o666); err != nil {
		return "", err
	}
	return path, os.Chmod(path, 0o666)
}

// terminationMessage is what the container left in its termination file, or the end of its
// log when the policy says so and it failed.
func terminationMessage(proc *process, exitCode int32) string {
	data, _ := os.ReadFile(proc.terminationFile)
	if len(data) > maxTerminationMessage {
		data = data[:maxTerminationMessage]
	}
	if len(data) == 0 && exitCode != 0 && proc.policy == corev1.TerminationMessageFallbackToLogsOnError {
		return logTail(proc.logPath, fallbackLogLines, fallbackLogBytes)
	}
	return string(data)
}

func logTail(path string, lines, maxBytes int) string {
	data, _ := os.ReadFile(path)
	text := strings.TrimRight(string(data), "\n")
	parts := strings.Split(text, "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	text = strings.Join(parts, "\n")
	if len(text) > maxBytes {
		text = text[len(text)-maxBytes:]
	}
	return text
}
