package main

// Startup, liveness and readiness probes (exec, tcpSocket, httpGet) with the kubelet's timings
// and thresholds. Exec probes run inside the container (its mount, PID and UTS namespaces, its
// user and env) through nsenter.

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// probe runs the container's probes for as long as this process lives.
func (c *containerRuntime) probe(proc *process) {
	spec := c.spec
	if spec.StartupProbe != nil {
		if !c.probeUntil(proc, spec.StartupProbe, "Startup", true) {
			return
		}
	}
	c.pod.mu.Lock()
	c.started = true
	c.ready = spec.ReadinessProbe == nil
	c.pod.mu.Unlock()
	c.pod.changed()
	if spec.LivenessProbe != nil {
		go c.probeUntil(proc, spec.LivenessProbe, "Liveness", false)
	}
	if spec.ReadinessProbe != nil {
		c.readiness(proc, spec.ReadinessProbe)
	}
}

// probeUntil runs a startup probe until it succeeds (true), or a liveness probe until it
// fails; failureThreshold failures in a row kill the container for a restart.
func (c *containerRuntime) probeUntil(proc *process, probe *corev1.Probe, kind string, untilSuccess bool) bool {
	t := probeTimings(probe)
	if !sleepWhileRunning(proc, t.initialDelay) {
		return false
	}
	failures, successes := 0, 0
	for proc.running() {
		err := c.runProbe(proc, probe, t.timeout)
		if err == nil {
			failures, successes = 0, successes+1
			if untilSuccess && successes >= 1 {
				return true
			}
		} else {
			successes, failures = 0, failures+1
			c.pod.event(corev1.EventTypeWarning, "Unhealthy", "%s probe failed: %v", kind, err)
			if failures >= t.failureThreshold {
				grace := c.pod.terminationGrace()
				if probe.TerminationGracePeriodSeconds != nil {
					grace = time.Duration(*probe.TerminationGracePeriodSeconds) * time.Second
				}
				c.pod.event(corev1.EventTypeNormal, "Killing", "Container %s failed %s probe, will be restarted", c.spec.Name, kind)
				proc.stop(grace)
				return false
			}
		}
		if !sleepWhileRunning(proc, t.period) {
			return false
		}
	}
	return false
}

// readiness updates the container's Ready flag with the thresholds.
func (c *containerRuntime) readiness(proc *process, probe *corev1.Probe) {
	t := probeTimings(probe)
	if !sleepWhileRunning(proc, t.initialDelay) {
		return
	}
	failures, successes := 0, 0
	for proc.running() {
		err := c.runProbe(proc, probe, t.timeout)
		if err == nil {
			failures, successes = 0, successes+1
		} else {
			successes, failures = 0, failures+1
		}
		c.pod.mu.Lock()
		ready := c.ready
		switch {
		case err == nil && successes >= t.successThreshold:
			ready = true
		case err != nil && failures >= t.failureThreshold:
			ready = false
		}
		changed := ready != c.ready && c.proc == proc
		if changed {
			c.ready = ready
		}
		c.pod.mu.Unlock()
		if changed {
			c.pod.changed()
		}
		if err != nil && failures == t.failureThreshold {
			c.pod.event(corev1.EventTypeWarning, "Unhealthy", "Readiness probe failed: %v", err)
		}
		if !sleepWhileRunning(proc, t.period) {
			return
		}
	}
}

type timings struct {
	initialDelay, period, timeout      time.Duration
	successThreshold, failureThreshold int
}

// probeTimings applies the API's defaults: period 10 s, timeout 1 s, thresholds 1 and 3.
func probeTimings(probe *corev1.Probe) timings {
	t := timings{
		initialDelay:     time.Duration(probe.InitialDelaySeconds) * time.Second,
		period:           10 * time.Second,
		timeout:          time.Second,
		successThreshold: 1,
		failureThreshold: 3,
	}
	if probe.PeriodSeconds > 0 {
		t.period = time.Duration(probe.PeriodSeconds) * time.Second
	}
	if probe.TimeoutSeconds > 0 {
		t.timeout = time.Duration(probe.TimeoutSeconds) * time.Second
	}
	if probe.SuccessThreshold > 0 {
		t.successThreshold = int(probe.SuccessThreshold)
	}
	if probe.FailureThreshold > 0 {
		t.failureThreshold = int(probe.FailureThreshold)
	}
	return t
}

func sleepWhileRunning(proc *process, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-proc.exited:
		return false
	}
}

func (c *containerRuntime) runProbe(proc *process, probe *corev1.Probe, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(c.pod.context(), timeout)
	defer cancel()
	switch {
	case probe.Exec != nil:
		output, err := execInContainer(ctx, proc, probe.Exec.Command, nil, nil, nil)
		if ctx.Err() != nil {
			return fmt.Errorf("command timed out after %s", timeout)
		}
		if err != nil {
			return fmt.Errorf("%v: %s", err, bytes.TrimSpace(output))
		}
		return nil
	case probe.TCPSocket != nil:
		port, err := c.resolvePort(probe.TCPSocket.Port)
		if err != nil {
			return err
		}
		host := probe.TCPSocket.Host
		if host == "" {
			host = c.pod.ip
		}
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	case probe.HTTPGet != nil:
		return c.httpProbe(ctx, probe.HTTPGet)
	case probe.GRPC != nil:
		return fmt.Errorf("gRPC probes are not supported by the test bed node")
	}
	return fmt.Errorf("probe has no handler")
}

func (c *containerRuntime) httpProbe(ctx context.Context, get *corev1.HTTPGetAction) error {
	port, err := c.resolvePort(get.Port)
	if err != nil {
		return err
	}
	host := get.Host
	if host == "" {
		host = c.pod.ip
	}
	scheme := "http"
	if get.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	url := fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(host, strconv.Itoa(port)), get.Path)
	request, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	request.Header.Set("User-Agent", "kube-probe/testbed")
	for _, h := range get.HTTPHeaders {
		request.Header.Set(h.Name, h.Value)
	}
	// As the kubelet: no certificate check, no redirects to other hosts followed blindly.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // #nosec G402
	response, err := client.Do(request)
	if err != nil {
		return err
	}
	defer response.Body.Close()
	if response.StatusCode < 200 || response.StatusCode >= 400 {
		return fmt.Errorf("HTTP probe failed with statuscode: %d", response.StatusCode)
	}
	return nil
}

// resolvePort turns a named port into the container's port number.
func (c *containerRuntime) resolvePort(port intstr.IntOrString) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, p := range c.spec.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("no port named %q in container %s", port.StrVal, c.spec.Name)
}

func (r *podRuntime) terminationGrace() time.Duration {
	pod := r.snapshot()
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return 30 * time.Second
}

// execInContainer runs a command in the container's namespaces as its user, with its env.
// With stdout nil the combined output is returned.
func execInContainer(ctx context.Context, proc *process, command []string, stdin *bytes.Reader, stdout, stderr *bytes.Buffer) ([]byte, error) {
	cmd := nsenterCommand(ctx, proc, command)
	if stdin != nil {
		cmd.Stdin = stdin
	}
	if stdout == nil {
		return cmd.CombinedOutput()
	}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	return nil, cmd.Run()
}

func nsenterCommand(ctx context.Context, proc *process, command []string) *exec.Cmd {
	args := []string{
		"--target", strconv.Itoa(proc.cmd.Process.Pid), "--mount", "--uts", "--pid",
		"--setuid", strconv.Itoa(int(proc.spec.UID)), "--setgid", strconv.Itoa(int(proc.spec.GID)),
		"--wd=" + proc.spec.WorkDir, "--",
	}
	cmd := exec.CommandContext(ctx, "nsenter", append(args, command...)...)
	cmd.Env = proc.spec.Env
	cmd.WaitDelay = time.Second
	return cmd
}
