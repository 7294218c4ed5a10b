package main

// The kubelet API behind `kubectl logs` and `kubectl exec`. Each run of a container writes its
// own log file; `--previous` reads the run before. Not supported: timestamps and since*.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
)

func (p *provider) container(namespace, podName, name string) (*containerRuntime, error) {
	runtime := p.lookup(namespace, podName)
	if runtime == nil {
		return nil, errdefs.NotFoundf("pod %s/%s is not running on this node", namespace, podName)
	}
	for _, c := range append(append([]*containerRuntime{}, runtime.init...), runtime.main...) {
		if c.spec.Name == name {
			return c, nil
		}
	}
	return nil, errdefs.NotFoundf("pod %s/%s has no container %q", namespace, podName, name)
}

func (p *provider) containerLogs(ctx context.Context, namespace, podName, name string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	c, err := p.container(namespace, podName, name)
	if err != nil {
		return nil, err
	}
	c.pod.mu.Lock()
	run, proc := c.restarts, c.proc
	c.pod.mu.Unlock()
	if opts.Previous {
		if run == 0 {
			return nil, errdefs.InvalidInputf("previous terminated container %q in pod %q not found", name, podName)
		}
		run--
		proc = nil
	}
	path := filepath.Join(c.pod.dir, "logs", name, fmt.Sprintf("%d.log", run))
	full, err := os.ReadFile(path)
	if err != nil {
		return nil, errdefs.NotFoundf("no log for container %q yet", name)
	}
	data := tailLines(full, opts.Tail)
	if opts.LimitBytes > 0 && len(data) > opts.LimitBytes {
		data = data[:opts.LimitBytes]
	}
	if !opts.Follow || proc == nil {
		return io.NopCloser(bytes.NewReader(data)), nil
	}
	reader, writer := io.Pipe()
	go follow(ctx, path, int64(len(full)), data, proc, writer)
	return reader, nil
}

// follow writes what is there, then what is appended, until the container's process exits.
func follow(ctx context.Context, path string, offset int64, first []byte, proc *process, out *io.PipeWriter) {
	if _, err := out.Write(first); err != nil {
		return
	}
	file, err := os.Open(path)
	if err != nil {
		out.CloseWithError(err)
		return
	}
	defer file.Close()
	if _, err := file.Seek(offset, io.SeekStart); err != nil {
		out.CloseWithError(err)
		return
	}
	for {
		if _, err := io.Copy(out, file); err != nil {
			return
		}
		if !proc.running() {
			_, _ = io.Copy(out, file)
			out.Close()
			return
		}
		select {
		case <-ctx.Done():
			out.Close()
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func tailLines(data []byte, n int) []byte {
	if n <= 0 {
		return data
	}
	lines := strings.SplitAfter(string(data), "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return []byte(strings.Join(lines, ""))
}

// runInContainer serves `kubectl exec` (no TTY: the command's output streams as it comes).
func (p *provider) runInContainer(ctx context.Context, namespace, podName, name string, command []string, attach api.AttachIO) error {
	c, err := p.container(namespace, podName, name)
	if err != nil {
		return err
	}
	c.pod.mu.Lock()
	proc := c.proc
	c.pod.mu.Unlock()
	if proc == nil || !proc.running() {
		return errdefs.InvalidInputf("container %q is not running", name)
	}
	cmd := nsenterCommand(ctx, proc, command)
	cmd.WaitDelay = 0
	if attach.Stdin() != nil {
		cmd.Stdin = attach.Stdin()
	}
	if attach.Stdout() != nil {
		cmd.Stdout = attach.Stdout()
		defer attach.Stdout().Close()
	}
	if attach.Stderr() != nil {
		cmd.Stderr = attach.Stderr()
		defer attach.Stderr().Close()
	}
	return cmd.Run()
}
