package main

// container-init: runs in the container's fresh mount, PID and UTS namespaces (as PID 1), makes
// the pod's files appear where the pod spec says, takes the container's user, and execs the
// container's program in its own place. Any failure before the exec goes to fd 4, which the
// agent reads as the container's start error.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

const (
	specFD  = 3
	errorFD = 4
)

func containerInit() {
	errPipe := os.NewFile(errorFD, "errors")
	syscall.CloseOnExec(errorFD)
	fail := func(format string, args ...any) {
		fmt.Fprintf(errPipe, format, args...)
		os.Exit(128)
	}
	var spec containerSpec
	specPipe := os.NewFile(specFD, "spec")
	if err := json.NewDecoder(specPipe).Decode(&spec); err != nil {
		fail("reading the container spec: %v", err)
	}
	specPipe.Close()

	if err := setUpMounts(spec.Mounts); err != nil {
		fail("%v", err)
	}
	if spec.ReadOnlyRoot {
		if err := makeRootReadOnly(spec.Mounts); err != nil {
			fail("%v", err)
		}
	}
	if spec.Hostname != "" {
		if err := syscall.Sethostname([]byte(spec.Hostname)); err != nil {
			fail("setting the hostname: %v", err)
		}
	}
	program, err := lookPath(spec.Argv[0], spec.Env)
	if err != nil {
		fail("exec: %q: %v", spec.Argv[0], err)
	}
	if err := takeUser(spec); err != nil {
		fail("%v", err)
	}
	if err := os.Chdir(spec.WorkDir); err != nil {
		fail("chdir to the working directory %q: %v", spec.WorkDir, err)
	}
	err = syscall.Exec(program, spec.Argv, spec.Env)
	fail("exec %q: %v", program, err)
}

// setUpMounts makes the container's view: a private copy of the mount tree, its own /proc,
// then the bind mounts, shallowest first so that nested mount points land inside the mounts
// above them instead of on the host. Every source is opened first: a mount over /tmp would
// otherwise hide a source that lives under /tmp.
func setUpMounts(mounts []mountSpec) error {
	sources := make([]*os.File, len(mounts))
	for i, m := range mounts {
		fd, err := unix.Open(m.Source, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("mounting %s at %s: %w", m.Source, m.Target, err)
		}
		sources[i] = os.NewFile(uintptr(fd), m.Source)
	}
	defer func() {
		for _, f := range sources {
			f.Close()
		}
	}()
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the mount tree private: %w", err)
	}
	if err := syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	order := make([]int, len(mounts))
	for i := range order {
		order[i] = i
	}
	depth := func(i int) int { return strings.Count(filepath.Clean(mounts[i].Target), "/") }
	sort.SliceStable(order, func(a, b int) bool { return depth(order[a]) < depth(order[b]) })
	for _, i := range order {
		source := fmt.Sprintf("/proc/self/fd/%d", sources[i].Fd())
		if err := bindMount(source, mounts[i]); err != nil {
			return err
		}
	}
	return nil
}

// makeRootReadOnly makes the root and the image's own directories read-only; the volumes
// mounted in them are mounts of their own and keep their flags.
func makeRootReadOnly(mounts []mountSpec) error {
	flags := uintptr(syscall.MS_BIND | syscall.MS_REMOUNT | syscall.MS_RDONLY)
	covered := map[string]int{}
	for _, m := range mounts {
		covered[filepath.Clean(m.Target)]++
	}
	for _, m := range mounts {
		// A volume mounted over the directory itself is what a remount would reach.
		if m.ImageRoot && covered[filepath.Clean(m.Target)] == 1 {
			if err := syscall.Mount("", m.Target, "", flags, ""); err != nil {
				return fmt.Errorf("making %s read-only: %w", m.Target, err)
			}
		}
	}
	if err := syscall.Mount("", "/", "", flags, ""); err != nil {
		return fmt.Errorf("making the root filesystem read-only: %w", err)
	}
	return nil
}

func bindMount(source string, m mountSpec) error {
	if err := ensureMountPoint(m.Target, m.File); err != nil {
		return fmt.Errorf("creating the mount point %s: %w", m.Target, err)
	}
	if err := syscall.Mount(source, m.Target, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("mounting %s at %s: %w", m.Source, m.Target, err)
	}
	if m.ReadOnly {
		flags := uintptr(syscall.MS_BIND | syscall.MS_REMOUNT | syscall.MS_RDONLY)
		if err := syscall.Mount("", m.Target, "", flags, ""); err != nil {
			return fmt.Errorf("making %s read-only: %w", m.Target, err)
		}
	}
	return nil
}

func ensureMountPoint(target string, file bool) error {
	if _, err := os.Stat(target); err == nil {
		return nil
	}
	if !file {
		return os.MkdirAll(target, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// takeUser switches to the container's numeric ids (Go applies them to every thread), keeps
// the death signal that a change of user clears, and sets no_new_privs when asked.
func takeUser(spec containerSpec) error {
	groups := make([]int, 0, len(spec.Groups))
	for _, g := range spec.Groups {
		groups = append(groups, int(g))
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups %v: %w", groups, err)
	}
	if err := syscall.Setgid(int(spec.GID)); err != nil {
		return fmt.Errorf("setgid %d: %w", spec.GID, err)
	}
	if err := syscall.Setuid(int(spec.UID)); err != nil {
		return fmt.Errorf("setuid %d: %w", spec.UID, err)
	}
	const prSetPdeathsig, prSetNoNewPrivs = 1, 38
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetPdeathsig, uintptr(syscall.SIGKILL), 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_PDEATHSIG): %w", errno)
	}
	if spec.NoNewPrivileges {
		if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetNoNewPrivs, 1, 0); errno != 0 {
			return fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", errno)
		}
	}
	return nil
}

// lookPath finds a program as execvp would, with the container's PATH.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		if err := executable(name); err != nil {
			return "", err
		}
		return name, nil
	}
	path := envMap(env)["PATH"]
	if path == "" {
		path = standardPath
	}
	for _, dir := range filepath.SplitList(path) {
		candidate := filepath.Join(dir, name)
		if executable(candidate) == nil {
			return candidate, nil
		}
	}
	return "", fmt.Errorf("executable file not found in $PATH (%s)", path)
}

func executable(path string) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	if info.IsDir() || info.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}
