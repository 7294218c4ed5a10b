package main

// Tests of the atomic writer, of volume refreshes (Secret, ConfigMap and downward API volumes
// following their sources) and of status updates that leave the pod's metadata alone.

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
)

func payloadOf(t *testing.T, files map[string]string, mode int32) map[string]payloadFile {
	t.Helper()
	var list []volumeFile
	for path, data := range files {
		list = append(list, volumeFile{path: path, data: []byte(data)})
	}
	payload, err := volumePayload(list, &mode)
	if err != nil {
		t.Fatal(err)
	}
	return payload
}

func readVolumeFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func timestampDirs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, entry := range entries {
		if entry.IsDir() && strings.HasPrefix(entry.Name(), "..") {
			dirs = append(dirs, entry.Name())
		}
	}
	return dirs
}

func TestTheAtomicWriterSwapsTheDataLinkAndKeepsTheDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "volume")
	written, err := writeAtomically(dir, payloadOf(t, map[string]string{"password": "one", "conf/pg_hba.conf": "local all all trust\n"}, 0o440), nil)
	if err != nil || !written {
		t.Fatalf("first write: %v, %v", written, err)
	}
	// The kubelet's layout: name -> ..data/name, ..data -> the timestamped directory.
	if target, err := os.Readlink(filepath.Join(dir, "password")); err != nil || target != "..data/password" {
		t.Errorf("password links to %q, %v", target, err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "conf")); err != nil || target != "..data/conf" {
		t.Errorf("conf links to %q, %v", target, err)
	}
	first, err := os.Readlink(filepath.Join(dir, dataDirName))
	if err != nil || !strings.HasPrefix(first, "..") {
		t.Fatalf("..data links to %q, %v", first, err)
	}
	info, err := os.Stat(filepath.Join(dir, "password"))
	if err != nil || info.Mode().Perm() != 0o440 {
		t.Errorf("password mode %v, %v", info.Mode(), err)
	}
	dirInfo, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}

	written, err = writeAtomically(dir, payloadOf(t, map[string]string{"password": "two", "username": "app"}, 0o440), nil)
	if err != nil || !written {
		t.Fatalf("second write: %v, %v", written, err)
	}
	if got := readVolumeFile(t, filepath.Join(dir, "password")); got != "two" {
		t.Errorf("password %q after the update", got)
	}
	if got := readVolumeFile(t, filepath.Join(dir, "username")); got != "app" {
		t.Errorf("username %q after the update", got)
	}
	if _, err := os.Lstat(filepath.Join(dir, "conf")); !os.IsNotExist(err) {
		t.Errorf("the link of a removed key is still there: %v", err)
	}
	if second, _ := os.Readlink(filepath.Join(dir, dataDirName)); second == first {
		t.Error("..data still points at the first directory")
	}
	if dirs := timestampDirs(t, dir); len(dirs) != 1 {
		t.Errorf("timestamped directories after the update: %v", dirs)
	}
	if _, err := os.Lstat(filepath.Join(dir, newDataDirName)); !os.IsNotExist(err) {
		t.Errorf("%s left behind: %v", newDataDirName, err)
	}
	// Same directory (a container's bind mount holds on to it).
	again, err := os.Stat(dir)
	if err != nil || !os.SameFile(dirInfo, again) {
		t.Error("the volume's directory was replaced")
	}
}

func TestTheAtomicWriterLeavesUnchangedContentAlone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "volume")
	payload := payloadOf(t, map[string]string{"a": "1", "b/c": "2"}, 0o644)
	if _, err := writeAtomically(dir, payload, nil); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Readlink(filepath.Join(dir, dataDirName))
	file, _ := os.Stat(filepath.Join(dir, "a"))
	written, err := writeAtomically(dir, payloadOf(t, map[string]string{"a": "1", "b/c": "2"}, 0o644), nil)
	if err != nil || written {
		t.Fatalf("unchanged content: written %v, %v", written, err)
	}
	after, _ := os.Readlink(filepath.Join(dir, dataDirName))
	again, _ := os.Stat(filepath.Join(dir, "a"))
	if before != after || !os.SameFile(file, again) {
		t.Errorf("unchanged content was rewritten: %s -> %s", before, after)
	}
	// A mode change is a change.
	written, err = writeAtomically(dir, payloadOf(t, map[string]string{"a": "1", "b/c": "2"}, 0o600), nil)
	if err != nil || !written {
		t.Errorf("a new mode: written %v, %v", written, err)
	}
}

func TestTheAtomicWriterGivesFilesToTheFSGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown)")
	}
	dir := filepath.Join(t.TempDir(), "volume")
	group := int64(4242)
	if _, err := writeAtomically(dir, payloadOf(t, map[string]string{"key": "v"}, 0o440), &group); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(filepath.Join(dir, "key"))
	if err != nil {
		t.Fatal(err)
	}
	if stat := info.Sys().(*syscall.Stat_t); stat.Uid != 0 || stat.Gid != 4242 || info.Mode().Perm() != 0o440 {
		t.Errorf("owner %d:%d mode %v", stat.Uid, stat.Gid, info.Mode())
	}
}

func TestTheAtomicWriterRefusesPathsThatClashWithItsOwn(t *testing.T) {
	if _, err := volumePayload([]volumeFile{{path: "..data"}}, nil); err == nil {
		t.Error("a path ..data should be refused")
	}
}

// testPod is a pod with a Secret, a ConfigMap (one item) and a downward API volume, running
// on a provider whose API server is a fake clientset.
func testPod(t *testing.T, objects ...any) (*podRuntime, *fake.Clientset) {
	t.Helper()
	client := fake.NewClientset()
	for _, obj := range objects {
		switch o := obj.(type) {
		case *corev1.Secret:
			if _, err := client.CoreV1().Secrets(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		case *corev1.ConfigMap:
			if _, err := client.CoreV1().ConfigMaps(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	yes := true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "db-1", Namespace: "ns", UID: "uid-1", Labels: map[string]string{"role": "replica"}},
		Spec: corev1.PodSpec{Volumes: []corev1.Volume{
			{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "credentials"}}},
			{Name: "optional", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "extra", Optional: &yes}}},
			{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "config"},
				Items:                []corev1.KeyToPath{{Key: "postgresql.conf", Path: "conf/postgresql.conf"}},
			}}},
			{Name: "labels", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
				Items: []corev1.DownwardAPIVolumeFile{{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}}},
			}}},
		}},
	}
	p := &provider{
		cfg:    config{runtimeDir: t.TempDir(), volumeSyncPeriod: time.Second},
		client: client,
		ctx:    context.Background(),
		pods:   map[string]*podRuntime{},
	}
	runtime := newPodRuntime(p, pod, "127.77.0.2")
	return runtime, client
}

func TestVolumesFollowTheirSourcesAndKeepTheLastContentOfADeletedOne(t *testing.T) {
	ctx := context.Background()
	r, client := testPod(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "credentials", Namespace: "ns"}, Data: map[string][]byte{"password": []byte("old")}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "extra", Namespace: "ns"}, Data: map[string][]byte{"token": []byte("t")}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "config", Namespace: "ns"}, Data: map[string]string{"postgresql.conf": "a = 1\n", "other": "x"}},
	)
	if err := r.prepareVolumes(); err != nil {
		t.Fatal(err)
	}
	password := filepath.Join(r.volumeDir("secret"), "password")
	conf := filepath.Join(r.volumeDir("config"), "conf", "postgresql.conf")
	labels := filepath.Join(r.volumeDir("labels"), "labels")
	if got := readVolumeFile(t, password); got != "old" {
		t.Fatalf("password %q", got)
	}
	if got := readVolumeFile(t, labels); got != `role="replica"` {
		t.Fatalf("labels %q", got)
	}
	dataLink := func(volume string) string {
		target, _ := os.Readlink(filepath.Join(r.volumeDir(volume), dataDirName))
		return target
	}
	configBefore := dataLink("config")
	failures := map[string]string{}

	// Nothing changed: nothing is rewritten.
	secretBefore := dataLink("secret")
	r.refreshVolumes(failures)
	if dataLink("secret") != secretBefore || dataLink("config") != configBefore || len(failures) != 0 {
		t.Errorf("a refresh without changes rewrote volumes or failed: %v", failures)
	}

	// A new password, a new label: both volumes follow; the ConfigMap's volume stays as it was.
	secret, _ := client.CoreV1().Secrets("ns").Get(ctx, "credentials", metav1.GetOptions{})
	secret.Data["password"] = []byte("new")
	if _, err := client.CoreV1().Secrets("ns").Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	configMap, _ := client.CoreV1().ConfigMaps("ns").Get(ctx, "config", metav1.GetOptions{})
	configMap.Data["other"] = "y" // not one of the volume's items
	if _, err := client.CoreV1().ConfigMaps("ns").Update(ctx, configMap, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.updateSpec(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "uid-1", Labels: map[string]string{"role": "primary", "app": "db"}}})
	r.refreshVolumes(failures)
	if got := readVolumeFile(t, password); got != "new" {
		t.Errorf("password %q after the Secret's update", got)
	}
	if got := readVolumeFile(t, labels); got != "app=\"db\"\nrole=\"primary\"" {
		t.Errorf("labels %q after the pod's update", got)
	}
	if dataLink("config") != configBefore {
		t.Error("the ConfigMap's volume was rewritten though its item did not change")
	}

	// The Secret is deleted: the volume keeps its last content, and the failure is reported.
	if err := client.CoreV1().Secrets("ns").Delete(ctx, "credentials", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// A required key goes missing from the ConfigMap: the same.
	delete(configMap.Data, "postgresql.conf")
	if _, err := client.CoreV1().ConfigMaps("ns").Update(ctx, configMap, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.refreshVolumes(failures)
	if got := readVolumeFile(t, password); got != "new" {
		t.Errorf("password %q after the Secret's deletion", got)
	}
	if got := readVolumeFile(t, conf); got != "a = 1\n" {
		t.Errorf("postgresql.conf %q after its key's removal", got)
	}
	if !strings.Contains(failures["secret"], "not found") || !strings.Contains(failures["config"], "no key") {
		t.Errorf("failures %v", failures)
	}

	// An optional Secret that is deleted empties its volume, as with the kubelet.
	if err := client.CoreV1().Secrets("ns").Delete(ctx, "extra", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.refreshVolumes(failures)
	if _, err := os.Lstat(filepath.Join(r.volumeDir("optional"), "token")); !os.IsNotExist(err) {
		t.Errorf("the deleted optional Secret's key is still there: %v", err)
	}
}

// TestAnUpdateIsSeenThroughTheContainersBindMount: the container sees the volume through a
// bind mount of its directory, made when it started; the swap of ..data inside it shows.
// A subPath mount binds the file itself and keeps the old content, as with the kubelet.
func TestAnUpdateIsSeenThroughTheContainersBindMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces and mounts)")
	}
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	volume := filepath.Join(dir, "volume")
	if _, err := writeAtomically(volume, payloadOf(t, map[string]string{"key": "old"}, 0o644), nil); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	mounted, sub := filepath.Join(dir, "mounted"), filepath.Join(dir, "sub")
	script := `cat ` + mounted + `/key; echo
for i in $(seq 200); do
  if [ "$(cat ` + mounted + `/key)" = new ]; then echo "saw new; subPath: $(cat ` + sub + `)"; exit 0; fi
  sleep 0.05
done
exit 1`
	proc, err := startProcess(containerSpec{
		Argv: []string{"sh", "-c", script}, Env: []string{"PATH=" + standardPath},
		WorkDir: "/", Hostname: "pod-a", UID: 999, GID: 999,
		Mounts: []mountSpec{
			{Source: volume, Target: mounted, ReadOnly: true},
			{Source: filepath.Join(volume, "key"), Target: sub, File: true, ReadOnly: true},
		},
	}, log, false)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := writeAtomically(volume, payloadOf(t, map[string]string{"key": "new"}, 0o644), nil); err != nil {
		t.Fatal(err)
	}
	result := proc.wait()
	output, _ := os.ReadFile(log.Name())
	if result.ExitCode != 0 || string(output) != "old\nsaw new; subPath: old\n" {
		t.Errorf("exit %d, output %q", result.ExitCode, output)
	}
}

func TestVolumeRefreshesReadTheInformerCachesAndAreKickedByChanges(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, client := testPod(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "credentials", Namespace: "ns"}, Data: map[string][]byte{"password": []byte("old")}})
	factory := informers.NewSharedInformerFactory(client, 0)
	r.p.watchObjects(factory.Core().V1().Secrets(), factory.Core().V1().ConfigMaps())
	r.p.pods[podKey("ns", "db-1")] = r
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())

	data, err := r.p.cachedObjectData(ctx, secretKind, "ns", "credentials", false)
	if err != nil || string(data["password"]) != "old" {
		t.Errorf("cached Secret: %v, %v", data, err)
	}
	if data, err := r.p.cachedObjectData(ctx, configMapKind, "ns", "missing", true); err != nil || data != nil {
		t.Errorf("a missing optional ConfigMap: %v, %v", data, err)
	}
	if _, err := r.p.cachedObjectData(ctx, configMapKind, "ns", "missing", false); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("a missing required ConfigMap: %v", err)
	}
	// Drain the kicks of the initial list, then a change in the pod's namespace kicks it.
	select {
	case <-r.volumesDirty:
	default:
	}
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "elsewhere"}}
	if _, err := client.CoreV1().Secrets("elsewhere").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mine := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "ns"}}
	if _, err := client.CoreV1().Secrets("ns").Create(ctx, mine, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.volumesDirty:
	case <-time.After(5 * time.Second):
		t.Error("a new Secret in the pod's namespace did not ask for a refresh")
	}
}

func TestStatusUpdatesLeaveThePodsMetadataAlone(t *testing.T) {
	ctx := context.Background()
	current := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: "db-1", Namespace: "ns", UID: "uid-1", Labels: map[string]string{"role": "primary"},
		Annotations: map[string]string{"note": "set later"}, Finalizers: []string{"example.com/keep"},
	}}
	client := fake.NewClientset(current)
	pods := statusOnlyPods{client.CoreV1()}.Pods("ns")
	// As the provider last saw the pod: an older label, no annotation, no finalizer.
	stale := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "db-1", Namespace: "ns", UID: "uid-1", Labels: map[string]string{"role": "replica"}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.77.0.2"},
	}
	if _, err := pods.UpdateStatus(ctx, stale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := client.CoreV1().Pods("ns").Get(ctx, "db-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Labels["role"] != "primary" || got.Annotations["note"] != "set later" || len(got.Finalizers) != 1 {
		t.Errorf("metadata changed by a status update: %+v", got.ObjectMeta)
	}
	if got.Status.Phase != corev1.PodRunning || got.Status.PodIP != "127.77.0.2" {
		t.Errorf("status not written: %+v", got.Status)
	}
	// A status for another pod of the same name is not found.
	stale.UID = "uid-0"
	if _, err := pods.UpdateStatus(ctx, stale, metav1.UpdateOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("status of a replaced pod: %v", err)
	}
}

// A hosts file is rewritten in place (same inode), never left empty between two contents, and
// not written at all when its content stays.
func TestRewriteInPlaceKeepsTheInodeAndTheContentWhole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hosts")
	long := "127.0.0.1\tlocalhost\n127.1.0.5\tdb-rw db-rw.ns db-rw.ns.svc\n"
	if err := rewriteInPlace(path, long); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	short := "127.0.0.1\tlocalhost\n"
	if err := rewriteInPlace(path, short); err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) {
		t.Fatal("the file was replaced, not rewritten in place")
	}
	if got, _ := os.ReadFile(path); string(got) != short {
		t.Fatalf("content %q, want %q", got, short)
	}
	unchanged := after.ModTime()
	time.Sleep(20 * time.Millisecond)
	if err := rewriteInPlace(path, short); err != nil {
		t.Fatal(err)
	}
	again, _ := os.Stat(path)
	if !again.ModTime().Equal(unchanged) {
		t.Fatal("an unchanged file was written again")
	}
}
