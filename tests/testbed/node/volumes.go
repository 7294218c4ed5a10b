package main

// Volumes as directories: emptyDir, secret, configMap, downwardAPI and projected (with the
// service account token) in the pod's runtime directory, the last four written and kept
// following their sources as the kubelet does (atomicwriter.go); persistentVolumeClaim as the
// directory of its bound PersistentVolume (the provisioner's hostPath), so data outlives the
// pod (the provisioner removes it when the volume is deleted); hostPath as is. fsGroup owns
// writable volumes as a kubelet makes it.

import (
	"context"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const defaultVolumeFileMode = 0o644

func (r *podRuntime) volumeDir(name string) string {
	return filepath.Join(r.dir, "volumes", name)
}

// volumePath is where a volume's files are on this machine.
func (r *podRuntime) volumePath(name string) (string, error) {
	pod := r.snapshot()
	for _, v := range pod.Spec.Volumes {
		if v.Name != name {
			continue
		}
		switch {
		case v.PersistentVolumeClaim != nil:
			return r.claimPath(v.PersistentVolumeClaim.ClaimName)
		case v.HostPath != nil:
			return v.HostPath.Path, nil
		default:
			return r.volumeDir(name), nil
		}
	}
	return "", fmt.Errorf("volume %q is mounted but not defined in the pod", name)
}

// prepareVolumes writes every volume's content; errors name the volume and say why.
func (r *podRuntime) prepareVolumes() error {
	pod := r.snapshot()
	ctx, cancel := context.WithTimeout(r.context(), 30*time.Second)
	defer cancel()
	fsGroup := podFSGroup(pod)
	for _, v := range pod.Spec.Volumes {
		dir := r.volumeDir(v.Name)
		var err error
		switch {
		case v.EmptyDir != nil:
			err = makeOwnedDir(dir, fsGroup)
		case followsSources(v):
			var payload map[string]payloadFile
			payload, err = r.volumeContent(ctx, pod, v, r.p.objectData, false)
			if err == nil {
				_, err = writeAtomically(dir, payload, fsGroup)
			}
		case v.PersistentVolumeClaim != nil:
			err = r.preparePersistentVolume(v.PersistentVolumeClaim.ClaimName, fsGroup, pod.Spec.SecurityContext)
		case v.HostPath != nil:
			err = prepareHostPath(v.HostPath)
		default:
			err = fmt.Errorf("this volume type is not supported by the test bed node")
		}
		if err != nil {
			return fmt.Errorf("MountVolume.SetUp failed for volume %q: %w", v.Name, err)
		}
	}
	return nil
}

// makeOwnedDir creates a writable directory, group-owned by fsGroup with the setgid bit when
// there is one, as the kubelet leaves an emptyDir.
func makeOwnedDir(dir string, fsGroup *int64) error {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	if fsGroup == nil {
		return os.Chmod(dir, 0o777)
	}
	if err := os.Chown(dir, 0, int(*fsGroup)); err != nil {
		return err
	}
	return os.Chmod(dir, 0o777|fs.ModeSetgid)
}

func podFSGroup(pod *corev1.Pod) *int64 {
	if pod.Spec.SecurityContext == nil {
		return nil
	}
	return pod.Spec.SecurityContext.FSGroup
}

// followsSources: Secret, ConfigMap, downward API and projected volumes are written by the
// atomic writer, and rewritten while the pod runs when their sources change.
func followsSources(v corev1.Volume) bool {
	return v.Secret != nil || v.ConfigMap != nil || v.DownwardAPI != nil || v.Projected != nil
}

// syncVolumes keeps the pod's Secret, ConfigMap, downward API and projected volumes following
// their sources until the pod stops, as the kubelet's periodic sync does: every
// --volume-sync-period, and at once when a Secret or ConfigMap of the pod's namespace or the
// pod's metadata changes.
func (r *podRuntime) syncVolumes() {
	defer r.volumeSync.Done()
	period := r.p.cfg.volumeSyncPeriod
	if period <= 0 {
		return
	}
	timer := time.NewTimer(period)
	defer timer.Stop()
	failures := map[string]string{}
	for {
		select {
		case <-r.stopping:
			return
		case <-timer.C:
		case <-r.volumesDirty:
		}
		r.refreshVolumes(failures)
		// Since Go 1.23, Reset needs no draining: no stale tick is left in the channel.
		timer.Reset(period)
	}
}

// kickVolumes asks for a volume sync now.
func (r *podRuntime) kickVolumes() {
	select {
	case r.volumesDirty <- struct{}{}:
	default:
	}
}

// refreshVolumes rewrites the volumes whose sources changed (read from the agent's informer
// caches). A source that cannot be read, such as a deleted Secret or a missing key, leaves the
// volume as it was, as with the kubelet; failures is the last error of each volume, so that
// each is reported once.
func (r *podRuntime) refreshVolumes(failures map[string]string) {
	pod := r.snapshot()
	ctx, cancel := context.WithTimeout(r.context(), 30*time.Second)
	defer cancel()
	for _, v := range pod.Spec.Volumes {
		if !followsSources(v) {
			continue
		}
		payload, err := r.volumeContent(ctx, pod, v, r.p.cachedObjectData, true)
		written := false
		if err == nil {
			written, err = writeAtomically(r.volumeDir(v.Name), payload, podFSGroup(pod))
		}
		if err != nil {
			if failures[v.Name] != err.Error() && !r.isStopping() {
				failures[v.Name] = err.Error()
				log.Printf("pod %s: volume %q keeps its content: %v", r, v.Name, err)
				r.event(corev1.EventTypeWarning, "FailedMount", "MountVolume.SetUp failed for volume %q: %v", v.Name, err)
			}
			continue
		}
		delete(failures, v.Name)
		if written {
			log.Printf("pod %s: volume %q updated", r, v.Name)
		}
	}
}

// volumeContent is the content of a Secret, ConfigMap, downward API or projected volume, with
// Secrets and ConfigMaps read by read. On a refresh, the service account token of a
// projected volume is the one already written (it is not re-issued).
func (r *podRuntime) volumeContent(ctx context.Context, pod *corev1.Pod, v corev1.Volume, read objectReader, refresh bool) (map[string]payloadFile, error) {
	var files []volumeFile
	var defaultMode *int32
	var err error
	switch {
	case v.Secret != nil:
		files, err = objectFiles(ctx, read, pod.Namespace, secretKind, v.Secret.SecretName, v.Secret.Items, isTrue(v.Secret.Optional))
		defaultMode = v.Secret.DefaultMode
	case v.ConfigMap != nil:
		files, err = objectFiles(ctx, read, pod.Namespace, configMapKind, v.ConfigMap.Name, v.ConfigMap.Items, isTrue(v.ConfigMap.Optional))
		defaultMode = v.ConfigMap.DefaultMode
	case v.DownwardAPI != nil:
		files = downwardFiles(pod, v.DownwardAPI.Items)
		defaultMode = v.DownwardAPI.DefaultMode
	case v.Projected != nil:
		files, err = r.projectedFiles(ctx, pod, v, read, refresh)
		defaultMode = v.Projected.DefaultMode
	default:
		err = fmt.Errorf("volume %q has no content to write", v.Name)
	}
	if err != nil {
		return nil, err
	}
	return volumePayload(files, defaultMode)
}

func isTrue(b *bool) bool { return b != nil && *b }

type volumeFile struct {
	path string
	data []byte
	mode *int32
}

// keyFiles picks a Secret's or ConfigMap's keys: all of them, or the listed items.
func keyFiles(data map[string][]byte, items []corev1.KeyToPath, what string, optional bool) ([]volumeFile, error) {
	if len(items) == 0 {
		files := make([]volumeFile, 0, len(data))
		for key, value := range data {
			files = append(files, volumeFile{path: key, data: value})
		}
		return files, nil
	}
	var files []volumeFile
	for _, item := range items {
		value, ok := data[item.Key]
		if !ok {
			if optional {
				continue
			}
			return nil, fmt.Errorf("%s has no key %q", what, item.Key)
		}
		files = append(files, volumeFile{path: item.Path, data: value, mode: item.Mode})
	}
	return files, nil
}

// objectFiles are the files of a Secret or ConfigMap volume (or projected source). A missing
// optional object gives no files, as with the kubelet (which empties the volume when such an
// object is deleted); a missing required one is an error.
func objectFiles(ctx context.Context, read objectReader, namespace string, kind objectKind, name string, items []corev1.KeyToPath, optional bool) ([]volumeFile, error) {
	data, err := read(ctx, kind, namespace, name, optional)
	if err != nil {
		return nil, err
	}
	return keyFiles(data, items, fmt.Sprintf("%s %q", kind, name), optional)
}

// projectedFiles merges a projected volume's sources; the service account token comes from a
// TokenRequest bound to the pod, once.
func (r *podRuntime) projectedFiles(ctx context.Context, pod *corev1.Pod, v corev1.Volume, read objectReader, refresh bool) ([]volumeFile, error) {
	var files []volumeFile
	for _, s := range v.Projected.Sources {
		var more []volumeFile
		var err error
		switch {
		case s.Secret != nil:
			more, err = objectFiles(ctx, read, pod.Namespace, secretKind, s.Secret.Name, s.Secret.Items, isTrue(s.Secret.Optional))
		case s.ConfigMap != nil:
			more, err = objectFiles(ctx, read, pod.Namespace, configMapKind, s.ConfigMap.Name, s.ConfigMap.Items, isTrue(s.ConfigMap.Optional))
		case s.DownwardAPI != nil:
			more = downwardFiles(pod, s.DownwardAPI.Items)
		case s.ServiceAccountToken != nil:
			if refresh {
				written := filepath.Join(r.volumeDir(v.Name), dataDirName, filepath.Clean("/"+s.ServiceAccountToken.Path))
				if token, readErr := os.ReadFile(written); readErr == nil {
					more = []volumeFile{{path: s.ServiceAccountToken.Path, data: token}}
					break
				}
			}
			more, err = r.serviceAccountToken(ctx, pod, s.ServiceAccountToken)
		default:
			err = fmt.Errorf("this projected source is not supported by the test bed node")
		}
		if err != nil {
			return nil, err
		}
		files = append(files, more...)
	}
	return files, nil
}

func (r *podRuntime) serviceAccountToken(ctx context.Context, pod *corev1.Pod, source *corev1.ServiceAccountTokenProjection) ([]volumeFile, error) {
	account := pod.Spec.ServiceAccountName
	if account == "" {
		account = "default"
	}
	request := &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: source.ExpirationSeconds,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}
	if source.Audience != "" {
		request.Spec.Audiences = []string{source.Audience}
	}
	token, err := r.p.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, account, request, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("service account token for %q: %w", account, err)
	}
	return []volumeFile{{path: source.Path, data: []byte(token.Status.Token)}}, nil
}

func downwardFiles(pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile) []volumeFile {
	var files []volumeFile
	for _, item := range items {
		var value string
		if item.FieldRef != nil {
			value, _ = fieldValue(pod, item.FieldRef.FieldPath)
		}
		files = append(files, volumeFile{path: item.Path, data: []byte(value), mode: item.Mode})
	}
	return files
}

// claimPath is the directory of the PersistentVolume bound to a claim.
func (r *podRuntime) claimPath(claimName string) (string, error) {
	pod := r.snapshot()
	ctx, cancel := context.WithTimeout(r.context(), 10*time.Second)
	defer cancel()
	claim, err := r.p.client.CoreV1().PersistentVolumeClaims(pod.Namespace).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("persistentvolumeclaim %q: %w", claimName, err)
	}
	if claim.Spec.VolumeName == "" || claim.Status.Phase != corev1.ClaimBound {
		return "", fmt.Errorf("persistentvolumeclaim %q is not bound yet", claimName)
	}
	volume, err := r.p.client.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("persistentvolume %q: %w", claim.Spec.VolumeName, err)
	}
	switch {
	case volume.Spec.HostPath != nil:
		return volume.Spec.HostPath.Path, nil
	case volume.Spec.Local != nil:
		return volume.Spec.Local.Path, nil
	}
	return "", fmt.Errorf("persistentvolume %q is neither hostPath nor local", volume.Name)
}

// preparePersistentVolume creates the volume's directory and, with an fsGroup, gives the group
// its content (recursively, unless fsGroupChangePolicy is OnRootMismatch and the root already
// matches), as the kubelet does for volumes that support ownership management.
func (r *podRuntime) preparePersistentVolume(claimName string, fsGroup *int64, sc *corev1.PodSecurityContext) error {
	path, err := r.claimPath(claimName)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(path, 0o755); err != nil {
		return err
	}
	if fsGroup == nil {
		return nil
	}
	gid := int(*fsGroup)
	if sc.FSGroupChangePolicy != nil && *sc.FSGroupChangePolicy == corev1.FSGroupChangeOnRootMismatch && rootMatches(path, gid) {
		return nil
	}
	return filepath.WalkDir(path, func(p string, entry fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if entry.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		info, err := entry.Info()
		if err != nil {
			return err
		}
		if err := os.Lchown(p, -1, gid); err != nil {
			return err
		}
		mode := info.Mode() | 0o060
		if entry.IsDir() {
			mode |= 0o010 | fs.ModeSetgid
		}
		return os.Chmod(p, mode&(fs.ModePerm|fs.ModeSetgid|fs.ModeSticky))
	})
}

func rootMatches(path string, gid int) bool {
	info, err := os.Stat(path)
	if err != nil {
		return false
	}
	stat, ok := info.Sys().(*syscall.Stat_t)
	return ok && int(stat.Gid) == gid && info.Mode()&fs.ModeSetgid != 0 && info.Mode()&0o070 == 0o070
}

func prepareHostPath(source *corev1.HostPathVolumeSource) error {
	if source.Type != nil && *source.Type == corev1.HostPathDirectoryOrCreate {
		return os.MkdirAll(source.Path, 0o755)
	}
	if _, err := os.Stat(source.Path); err != nil && source.Type != nil && *source.Type != corev1.HostPathUnset {
		return err
	}
	return nil
}
