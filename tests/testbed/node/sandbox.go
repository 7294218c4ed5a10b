package main

// A pod's sandbox: the directories that every container of the pod shares (its own /tmp,
// /dev/shm and /run, its hosts file, its users), its volumes, and the mount list and user of
// each container.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Directories every pod gets privately, as a container image's own empty ones would be.
var podPrivateDirs = map[string]os.FileMode{
	"/tmp":     0o1777,
	"/dev/shm": 0o1777,
	"/run":     0o755,
}

// The private directories that belong to the image's root filesystem, read-only under
// readOnlyRootFilesystem; /dev/shm is the runtime's own tmpfs and stays writable.
var imageRootDirs = map[string]bool{"/tmp": true, "/run": true}

// prepareSandbox makes the pod's directories and volumes, retrying (as a kubelet does with
// FailedMount) until it works or the pod is deleted. It errs only when the pod stops first.
func (r *podRuntime) prepareSandbox() error {
	for _, dir := range []string{"tmp", "dev/shm", "run/postgresql", "etc", "volumes"} {
		if err := os.MkdirAll(filepath.Join(r.dir, dir), 0o755); err != nil {
			return err
		}
	}
	for dir, mode := range map[string]os.FileMode{"tmp": 0o1777, "dev/shm": 0o1777, "run/postgresql": 0o3777} {
		if err := os.Chmod(filepath.Join(r.dir, dir), mode); err != nil {
			return err
		}
	}
	if err := r.writeIdentityFiles(); err != nil {
		return err
	}
	if err := r.p.writeHosts(r); err != nil {
		return err
	}
	for {
		err := r.prepareVolumes()
		if err == nil {
			return nil
		}
		r.event(corev1.EventTypeWarning, "FailedMount", "%v", err)
		for _, c := range append(append([]*containerRuntime{}, r.init...), r.main...) {
			c.setWaiting("ContainerCreating", err.Error())
		}
		if !r.waitOrStop(2 * time.Second) {
			return fmt.Errorf("stopped while preparing volumes: %w", err)
		}
	}
}

// writeIdentityFiles writes the pod's /etc/hostname, and /etc/passwd and /etc/group: the host's
// plus the users of the pod's images (postgres is uid 999 in the postgres image).
func (r *podRuntime) writeIdentityFiles() error {
	if err := os.WriteFile(filepath.Join(r.dir, "etc/hostname"), []byte(r.hostname()+"\n"), 0o644); err != nil {
		return err
	}
	passwd, _ := os.ReadFile("/etc/passwd")
	group, _ := os.ReadFile("/etc/group")
	passwdLines := strings.Split(strings.TrimRight(string(passwd), "\n"), "\n")
	groupLines := strings.Split(strings.TrimRight(string(group), "\n"), "\n")
	pod := r.snapshot()
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		image, err := r.p.images.resolve(c.Image)
		if err != nil {
			continue
		}
		passwdLines = addEntries(passwdLines, image.passwd)
		groupLines = addEntries(groupLines, image.group)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "etc/passwd"), []byte(strings.Join(passwdLines, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(r.dir, "etc/group"), []byte(strings.Join(groupLines, "\n")+"\n"), 0o644)
}

// addEntries adds the image's passwd or group lines; they replace the host's lines with the
// same name or numeric id (the image's postgres user is 999, the host's may be another).
func addEntries(lines, extra []string) []string {
	for _, line := range extra {
		fields := strings.Split(line, ":")
		if len(fields) < 3 {
			continue
		}
		lines = slices.DeleteFunc(lines, func(existing string) bool {
			other := strings.Split(existing, ":")
			return len(other) > 2 && (other[0] == fields[0] || other[2] == fields[2])
		})
		lines = append(lines, line)
	}
	return lines
}

// hostname is what `hostname` prints in the pod: spec.hostname, else the pod's name.
func (r *podRuntime) hostname() string {
	pod := r.snapshot()
	if pod.Spec.Hostname != "" {
		return pod.Spec.Hostname
	}
	if len(pod.Name) > 63 {
		return pod.Name[:63]
	}
	return pod.Name
}

// containerMounts lists a container's bind mounts: the pod's private directories and files, the
// image's files, the termination-message file and the container's volume mounts.
func (r *podRuntime) containerMounts(spec corev1.Container, image imageConfig, termination string) ([]mountSpec, error) {
	var mounts []mountSpec
	for target := range podPrivateDirs {
		mounts = append(mounts, mountSpec{Source: filepath.Join(r.dir, strings.TrimPrefix(target, "/")), Target: target, ImageRoot: imageRootDirs[target]})
	}
	for _, name := range []string{"hosts", "hostname", "passwd", "group"} {
		mounts = append(mounts, mountSpec{Source: filepath.Join(r.dir, "etc", name), Target: "/etc/" + name, File: true, ReadOnly: name != "hosts"})
	}
	for target, source := range image.files {
		mounts = append(mounts, mountSpec{Source: source, Target: target, File: true, ReadOnly: true})
	}
	messagePath := spec.TerminationMessagePath
	if messagePath == "" {
		messagePath = corev1.TerminationMessagePathDefault
	}
	mounts = append(mounts, mountSpec{Source: termination, Target: messagePath, File: true})
	for _, vm := range spec.VolumeMounts {
		source, err := r.volumePath(vm.Name)
		if err != nil {
			return nil, err
		}
		if vm.SubPath != "" {
			source = filepath.Join(source, filepath.Clean("/"+vm.SubPath))
			if _, err := os.Stat(source); os.IsNotExist(err) {
				if err := os.MkdirAll(source, 0o755); err != nil {
					return nil, err
				}
			}
		}
		info, err := os.Stat(source)
		if err != nil {
			return nil, fmt.Errorf("volume %q: %w", vm.Name, err)
		}
		mounts = append(mounts, mountSpec{Source: source, Target: vm.MountPath, ReadOnly: vm.ReadOnly, File: !info.IsDir()})
	}
	return mounts, nil
}

type containerIDs struct {
	uid, gid uint32
	groups   []uint32
}

// containerUser resolves the numeric user the process runs as: the container's security
// context, else the pod's, else the image's; fsGroup and supplementalGroups join its groups.
func containerUser(pod *corev1.Pod, spec corev1.Container, image imageConfig) (containerIDs, error) {
	uid, gid := image.uid, image.gid
	var runAsNonRoot *bool
	podSC := pod.Spec.SecurityContext
	if podSC != nil {
		if podSC.RunAsUser != nil {
			uid = *podSC.RunAsUser
		}
		if podSC.RunAsGroup != nil {
			gid = *podSC.RunAsGroup
		}
		runAsNonRoot = podSC.RunAsNonRoot
	}
	if sc := spec.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = *sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = *sc.RunAsGroup
		}
		if sc.RunAsNonRoot != nil {
			runAsNonRoot = sc.RunAsNonRoot
		}
	}
	if runAsNonRoot != nil && *runAsNonRoot && uid == 0 {
		return containerIDs{}, errConfig{"container has runAsNonRoot and image will run as root"}
	}
	ids := containerIDs{uid: uint32(uid), gid: uint32(gid)}
	if podSC != nil {
		if podSC.FSGroup != nil {
			ids.groups = append(ids.groups, uint32(*podSC.FSGroup))
		}
		for _, g := range podSC.SupplementalGroups {
			ids.groups = append(ids.groups, uint32(g))
		}
	}
	return ids, nil
}
