package main

// Volumes as directories: emptyDir, secret, configMap, downwardAPI and projected (with the
// service account token) in the pod's runtime directory; persistentVolumeClaim as the
// directory of its bound PersistentVolume (the provisioner's hostPath), so data outlives the
// pod (the provisioner removes it when the volume is deleted); hostPath as is. fsGroup owns
// writable volumes as a kubelet makes it.

import (
	"context"
	"fmt"
	"io/fs"
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
	var fsGroup *int64
	if pod.Spec.SecurityContext != nil {
		fsGroup = pod.Spec.SecurityContext.FSGroup
	}
	for _, v := range pod.Spec.Volumes {
		dir := r.volumeDir(v.Name)
		var err error
		switch {
		case v.EmptyDir != nil:
			err = makeOwnedDir(dir, fsGroup)
		case v.Secret != nil:
			err = r.writeSecretVolume(ctx, dir, v.Secret, fsGroup)
		case v.ConfigMap != nil:
			err = r.writeConfigMapVolume(ctx, dir, v.ConfigMap, fsGroup)
		case v.DownwardAPI != nil:
			err = r.writeFiles(dir, downwardFiles(pod, v.DownwardAPI.Items), v.DownwardAPI.DefaultMode, fsGroup)
		case v.Projected != nil:
			err = r.writeProjectedVolume(ctx, dir, v.Projected, fsGroup)
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

// writeFiles replaces a volume directory's content with the given files. Files are owned by
// root and, with an fsGroup, by that group, with the item's mode or the default one.
func (r *podRuntime) writeFiles(dir string, files []volumeFile, defaultMode *int32, fsGroup *int64) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, file := range files {
		path := filepath.Join(dir, filepath.Clean("/"+file.path))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		mode := fs.FileMode(defaultVolumeFileMode)
		if defaultMode != nil {
			mode = fs.FileMode(*defaultMode)
		}
		if file.mode != nil {
			mode = fs.FileMode(*file.mode)
		}
		if err := os.WriteFile(path, file.data, mode); err != nil {
			return err
		}
		if err := os.Chmod(path, mode); err != nil {
			return err
		}
		if fsGroup != nil {
			if err := os.Chown(path, 0, int(*fsGroup)); err != nil {
				return err
			}
		}
	}
	return nil
}

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

// objectFiles are the files of a Secret or ConfigMap volume (or projected source).
func (r *podRuntime) objectFiles(ctx context.Context, kind objectKind, name string, items []corev1.KeyToPath, optional bool) ([]volumeFile, error) {
	data, err := r.p.objectData(ctx, kind, r.snapshot().Namespace, name, optional)
	if err != nil {
		return nil, err
	}
	return keyFiles(data, items, fmt.Sprintf("%s %q", kind, name), optional)
}

func (r *podRuntime) writeSecretVolume(ctx context.Context, dir string, source *corev1.SecretVolumeSource, fsGroup *int64) error {
	files, err := r.objectFiles(ctx, secretKind, source.SecretName, source.Items, source.Optional != nil && *source.Optional)
	if err != nil {
		return err
	}
	return r.writeFiles(dir, files, source.DefaultMode, fsGroup)
}

func (r *podRuntime) writeConfigMapVolume(ctx context.Context, dir string, source *corev1.ConfigMapVolumeSource, fsGroup *int64) error {
	files, err := r.objectFiles(ctx, configMapKind, source.Name, source.Items, source.Optional != nil && *source.Optional)
	if err != nil {
		return err
	}
	return r.writeFiles(dir, files, source.DefaultMode, fsGroup)
}

// writeProjectedVolume merges its sources; the service account token comes from a
// TokenRequest bound to the pod (it is not refreshed).
func (r *podRuntime) writeProjectedVolume(ctx context.Context, dir string, source *corev1.ProjectedVolumeSource, fsGroup *int64) error {
	pod := r.snapshot()
	var files []volumeFile
	for _, s := range source.Sources {
		var more []volumeFile
		var err error
		switch {
		case s.Secret != nil:
			more, err = r.objectFiles(ctx, secretKind, s.Secret.Name, s.Secret.Items, s.Secret.Optional != nil && *s.Secret.Optional)
		case s.ConfigMap != nil:
			more, err = r.objectFiles(ctx, configMapKind, s.ConfigMap.Name, s.ConfigMap.Items, s.ConfigMap.Optional != nil && *s.ConfigMap.Optional)
		case s.DownwardAPI != nil:
			more = downwardFiles(pod, s.DownwardAPI.Items)
		case s.ServiceAccountToken != nil:
			more, err = r.serviceAccountToken(ctx, pod, s.ServiceAccountToken)
		default:
			err = fmt.Errorf("this projected source is not supported by the test bed node")
		}
		if err != nil {
			return err
		}
		files = append(files, more...)
	}
	return r.writeFiles(dir, files, source.DefaultMode, fsGroup)
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
