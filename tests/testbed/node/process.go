package main

// A container's process: started through `testbed-node container-init` in new mount, PID and
// UTS namespaces, so that its program is PID 1 of its own PID namespace (when it exits, the
// kernel kills everything it left behind) and sees its pod's files at the paths the pod spec
// names. It dies with the agent (parent-death signal).

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const containerInitArg = "container-init"

// containerSpec is what container-init needs, passed on a pipe as JSON.
type containerSpec struct {
	Argv            []string
	Env             []string
	WorkDir         string
	Hostname        string
	UID, GID        uint32
	Groups          []uint32
	Mounts          []mountSpec
	NoNewPrivileges bool
	// ReadOnlyRoot makes everything but the volumes, /proc, /dev and the pod's files
	// read-only, as readOnlyRootFilesystem does to an image's root.
	ReadOnlyRoot bool
}

// mountSpec is a bind mount into the container; File mounts a single file. ImageRoot marks a
// directory of the image's own root filesystem: ReadOnlyRoot makes it read-only once every
// mount point in it is made.
type mountSpec struct {
	Source, Target            string
	ReadOnly, File, ImageRoot bool
}

type process struct {
	cmd       *exec.Cmd
	spec      containerSpec
	startedAt time.Time
	exited    chan struct{}
	result    *corev1.ContainerStateTerminated

	terminationFile string
	logPath         string
	policy          corev1.TerminationMessagePolicy

	stdin    *os.File
	stopOnce sync.Once
}

// startProcess starts container-init and waits until it has exec'd the container's program;
// a failure before that (a bad mount, a missing program) is returned as the start error.
func startProcess(spec containerSpec, log *os.File, keepStdinOpen bool) (*process, error) {
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	specRead, specWrite, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errRead, errWrite, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, containerInitArg)
	cmd.Env = []string{}
	cmd.Stdout, cmd.Stderr = log, log
	var stdinWrite *os.File
	if keepStdinOpen {
		// Nothing writes to it, but it stays open while the container runs: a program that
		// reads stdin waits, as with `stdin: true` and nobody attached.
		stdinRead, write, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		defer stdinRead.Close()
		cmd.Stdin, stdinWrite = stdinRead, write
	}
	cmd.ExtraFiles = []*os.File{specRead, errWrite} // fds 3 and 4 in the child
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS,
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		specRead.Close()
		specWrite.Close()
		errRead.Close()
		errWrite.Close()
		return nil, fmt.Errorf("starting container-init: %w", err)
	}
	specRead.Close()
	errWrite.Close()
	_, _ = specWrite.Write(specJSON)
	specWrite.Close()
	// The error pipe is close-on-exec in the child: EOF with nothing read means the exec
	// happened; anything else is why it did not.
	message, _ := io.ReadAll(errRead)
	errRead.Close()
	p := &process{cmd: cmd, spec: spec, startedAt: time.Now(), exited: make(chan struct{}), stdin: stdinWrite}
	go p.reap()
	if len(message) > 0 {
		<-p.exited
		return nil, fmt.Errorf("%s", strings.TrimSpace(string(message)))
	}
	return p, nil
}

func (p *process) reap() {
	err := p.cmd.Wait()
	if p.stdin != nil {
		p.stdin.Close()
	}
	result := &corev1.ContainerStateTerminated{
		StartedAt:  metav1.NewTime(p.startedAt),
		FinishedAt: metav1.Now(),
	}
	state := p.cmd.ProcessState
	switch {
	case state == nil:
		result.ExitCode, result.Reason, result.Message = 128, "Error", fmt.Sprint(err)
	case state.Exited():
		result.ExitCode = int32(state.ExitCode())
	default:
		if status, ok := state.Sys().(syscall.WaitStatus); ok && status.Signaled() {
			result.ExitCode = 128 + int32(status.Signal())
			result.Signal = int32(status.Signal())
		}
	}
	if result.Reason == "" {
		result.Reason = "Completed"
		if result.ExitCode != 0 {
			result.Reason = "Error"
		}
	}
	p.result = result
	close(p.exited)
}

// wait blocks until the process has exited and returns its terminated state.
func (p *process) wait() *corev1.ContainerStateTerminated {
	<-p.exited
	result := p.result.DeepCopy()
	if p.terminationFile != "" {
		result.Message = terminationMessage(p, result.ExitCode)
	}
	return result
}

func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop: SIGTERM to the container's PID 1 (which, as in any container, ignores it unless it
// handles it), then SIGKILL after the grace period, which ends the whole PID namespace.
func (p *process) stop(grace time.Duration) {
	p.stopOnce.Do(func() {
		go func() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			timer := time.NewTimer(grace)
			defer timer.Stop()
			select {
			case <-p.exited:
			case <-timer.C:
				_ = p.cmd.Process.Signal(syscall.SIGKILL)
			}
		}()
	})
}
