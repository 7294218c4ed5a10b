package main

// Unit tests of the agent's pure parts. The agent as a whole is tested end to end by the
// Rust test suite (tests/testbed_node.rs) against the running test bed.

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestExpandFollowsKubernetesRules(t *testing.T) {
	vars := map[string]string{"A": "1", "B": "two"}
	cases := map[string]string{
		"$(A)-$(B)":   "1-two",
		"$(MISSING)":  "$(MISSING)",
		"$$(A)":       "$(A)",
		"cost $5":     "cost $5",
		"open $(A":    "open $(A",
		"trailing $":  "trailing $",
		"--port=$(A)": "--port=1",
	}
	for input, want := range cases {
		if got := expand(input, vars); got != want {
			t.Errorf("expand(%q) = %q, want %q", input, got, want)
		}
	}
}

func TestSplitImage(t *testing.T) {
	cases := map[string][2]string{
		"postgres:15":                        {"postgres", "15"},
		"registry:5000/library/postgres:16":  {"registry:5000/library/postgres", "16"},
		"ghcr.io/pgkube/pgkube":              {"ghcr.io/pgkube/pgkube", "latest"},
		"busybox:1.36@sha256:0123456789abcd": {"busybox", "1.36"},
	}
	for image, want := range cases {
		repository, tag := splitImage(image)
		if repository != want[0] || tag != want[1] {
			t.Errorf("splitImage(%q) = %q, %q; want %q, %q", image, repository, tag, want[0], want[1])
		}
	}
}

func TestPostgresImageNeedsAnInstalledMajor(t *testing.T) {
	root := t.TempDir()
	bin := filepath.Join(root, "15", "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "postgres"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	resolver := imageResolver{cfg: config{postgresLibs: root, imagesDir: "/images"}}
	image, err := resolver.resolve("docker.io/library/postgres:15.4")
	if err != nil {
		t.Fatalf("postgres:15.4: %v", err)
	}
	if !strings.HasPrefix(envMap(image.env)["PATH"], bin+":") || envMap(image.env)["PG_MAJOR"] != "15" {
		t.Errorf("postgres:15 env = %v", image.env)
	}
	_, err = resolver.resolve("postgres:17")
	if err == nil || !strings.Contains(err.Error(), "PostgreSQL 17, which is not installed") || !strings.Contains(err.Error(), "installed: 15") {
		t.Errorf("postgres:17 error = %v", err)
	}
	if _, err := resolver.resolve("nginx:1"); err == nil || !strings.Contains(err.Error(), "not mapped") {
		t.Errorf("nginx error = %v", err)
	}
}

func TestContainerArgvFollowsCommandAndArgsRules(t *testing.T) {
	image := imageConfig{entrypoint: []string{"entry"}, cmd: []string{"default"}}
	env := []string{"PORT=5432"}
	cases := []struct {
		command, args, want []string
	}{
		{nil, nil, []string{"entry", "default"}},
		{nil, []string{"-c", "port=$(PORT)"}, []string{"entry", "-c", "port=5432"}},
		{[]string{"sh", "-c"}, nil, []string{"sh", "-c"}},
		{[]string{"sh"}, []string{"-c", "x"}, []string{"sh", "-c", "x"}},
	}
	for _, c := range cases {
		got := containerArgv(corev1.Container{Command: c.command, Args: c.args}, image, env)
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("command %v args %v: argv %v, want %v", c.command, c.args, got, c.want)
		}
	}
}

func TestBackOffDoublesToFiveMinutesAndResets(t *testing.T) {
	var got []time.Duration
	backOff := time.Duration(0)
	for range 8 {
		backOff = nextBackOff(backOff, time.Second)
		got = append(got, backOff)
	}
	want := []time.Duration{time.Nanosecond, 10 * time.Second, 20 * time.Second, 40 * time.Second,
		80 * time.Second, 160 * time.Second, 300 * time.Second, 300 * time.Second}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("back-offs %v, want %v", got, want)
	}
	if nextBackOff(300*time.Second, 11*time.Minute) != 0 {
		t.Error("a container that ran 11 minutes should restart without back-off")
	}
}

func TestFieldValues(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: map[string]string{"app": "db"}},
		Spec:       corev1.PodSpec{NodeName: "testbed-local"},
		Status:     corev1.PodStatus{PodIP: "127.100.0.2"},
	}
	cases := map[string]string{
		"metadata.name": "p", "metadata.namespace": "ns", "metadata.labels['app']": "db",
		"spec.nodeName": "testbed-local", "status.podIP": "127.100.0.2",
	}
	for path, want := range cases {
		if got, err := fieldValue(pod, path); err != nil || got != want {
			t.Errorf("fieldValue(%s) = %q, %v; want %q", path, got, err, want)
		}
	}
	if _, err := fieldValue(pod, "spec.unknown"); err == nil {
		t.Error("an unknown field path should be an error")
	}
}

func TestUserComesFromContainerThenPodThenImage(t *testing.T) {
	uid, gid, fsGroup, root := int64(999), int64(998), int64(997), int64(0)
	yes := true
	pod := &corev1.Pod{Spec: corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{
		RunAsUser: &uid, RunAsGroup: &gid, FSGroup: &fsGroup, SupplementalGroups: []int64{5},
	}}}
	ids, err := containerUser(pod, corev1.Container{}, imageConfig{uid: 65532, gid: 65532})
	if err != nil || ids.uid != 999 || ids.gid != 998 || !reflect.DeepEqual(ids.groups, []uint32{997, 5}) {
		t.Errorf("pod security context: %+v, %v", ids, err)
	}
	ids, err = containerUser(&corev1.Pod{}, corev1.Container{}, imageConfig{uid: 65532, gid: 65532})
	if err != nil || ids.uid != 65532 {
		t.Errorf("image user: %+v, %v", ids, err)
	}
	_, err = containerUser(&corev1.Pod{}, corev1.Container{SecurityContext: &corev1.SecurityContext{
		RunAsUser: &root, RunAsNonRoot: &yes,
	}}, imageConfig{})
	if err == nil || !strings.Contains(err.Error(), "runAsNonRoot") {
		t.Errorf("runAsNonRoot with uid 0: %v", err)
	}
}

// TestMain lets the test binary play container-init, as the agent binary does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == containerInitArg {
		containerInit()
	}
	os.Exit(m.Run())
}

func TestAContainerProcessGetsItsMountsUserHostnameAndExitCode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces and mounts)")
	}
	dir := t.TempDir()
	// The container's user must be able to reach the mount point.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	volume := filepath.Join(dir, "volume")
	termination := filepath.Join(dir, "termination")
	for _, file := range []struct {
		path string
		data string
		mode os.FileMode
	}{{volume, "from the volume\n", 0o644}, {termination, "", 0o666}} {
		if err := os.WriteFile(file.path, []byte(file.data), file.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(file.path, file.mode); err != nil {
			t.Fatal(err)
		}
	}
	log, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	target := filepath.Join(dir, "mounted")
	script := `hostname; id -u; id -g; echo "$GREETING"; cat ` + target + `; echo "pid $$"; echo gone >/dev/termination-log; exit 3`
	privateTmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(privateTmp, 0o1777); err != nil {
		t.Fatal(err)
	}
	proc, err := startProcess(containerSpec{
		Argv: []string{"sh", "-c", script}, Env: []string{"PATH=" + standardPath, "GREETING=hello"},
		WorkDir: "/", Hostname: "pod-a", UID: 999, GID: 999,
		// The pod's own /tmp hides the host's, where this test's sources are: they must be
		// opened before it is mounted.
		Mounts: []mountSpec{
			{Source: volume, Target: target, File: true, ReadOnly: true},
			{Source: termination, Target: "/dev/termination-log", File: true},
			{Source: privateTmp, Target: "/tmp"},
		},
	}, log, false)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	proc.terminationFile, proc.logPath = termination, log.Name()
	result := proc.wait()
	output, _ := os.ReadFile(log.Name())
	if result.ExitCode != 3 || result.Reason != "Error" || result.Message != "gone\n" {
		t.Errorf("result %+v, output %s", result, output)
	}
	want := "pod-a\n999\n999\nhello\nfrom the volume\npid 1\n"
	if string(output) != want {
		t.Errorf("output %q, want %q", output, want)
	}
}

func TestAProgramThatDoesNotExistIsAStartError(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces and mounts)")
	}
	_, err := startProcess(containerSpec{Argv: []string{"no-such-program"}, Env: []string{"PATH=/usr/bin"}, WorkDir: "/"}, os.Stderr, false)
	if err == nil || !strings.Contains(err.Error(), "executable file not found") {
		t.Errorf("start error = %v", err)
	}
}

func TestImageUsersReplaceHostUsersWithTheSameNameOrID(t *testing.T) {
	host := []string{"root:x:0:0::/root:/bin/bash", "postgres:x:101:104::/var/lib/postgresql:/bin/bash", "other:x:999:999::/:/bin/sh"}
	got := addEntries(host, []string{"postgres:x:999:999:PostgreSQL:/var/lib/postgresql:/bin/bash"})
	want := []string{"root:x:0:0::/root:/bin/bash", "postgres:x:999:999:PostgreSQL:/var/lib/postgresql:/bin/bash"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("passwd %v, want %v", got, want)
	}
}

func TestAConditionKeepsTheTimeOfItsLastTransition(t *testing.T) {
	p := &provider{cfg: config{runtimeDir: t.TempDir()}, pods: map[string]*podRuntime{}}
	r := newPodRuntime(p, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"}}, "127.77.0.2")
	since := func(pod *corev1.Pod, kind corev1.PodConditionType) metav1.Time {
		for _, c := range pod.Status.Conditions {
			if c.Type == kind {
				return c.LastTransitionTime
			}
		}
		t.Fatalf("no %s condition", kind)
		return metav1.Time{}
	}
	first := since(r.snapshot(), corev1.PodInitialized)
	time.Sleep(10 * time.Millisecond)
	if again := since(r.snapshot(), corev1.PodInitialized); !again.Equal(&first) {
		t.Errorf("an unchanged condition moved from %v to %v", first, again)
	}
	r.mu.Lock()
	r.initialized = true
	r.mu.Unlock()
	if changed := since(r.snapshot(), corev1.PodInitialized); !first.Before(&changed) {
		t.Errorf("a changed condition kept its time %v", changed)
	}
}

func TestATaintIsKeyValueAndEffect(t *testing.T) {
	taint, err := parseTaint("pgkube.io/testbed-node-b=true:NoSchedule")
	want := corev1.Taint{Key: "pgkube.io/testbed-node-b", Value: "true", Effect: corev1.TaintEffectNoSchedule}
	if err != nil || taint == nil || *taint != want {
		t.Errorf("parseTaint: %v, %v; want %v", taint, err, want)
	}
	if taint, err := parseTaint(""); taint != nil || err != nil {
		t.Errorf("no taint: %v, %v", taint, err)
	}
	if _, err := parseTaint("no-effect"); err == nil {
		t.Error("a taint without an effect is refused")
	}
}

func TestThePodsOfPeerNodesResolveByTheirAddresses(t *testing.T) {
	ready := corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue}
	peer := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "db-1", Namespace: "ns", Labels: map[string]string{"app": "db"}},
		Spec:       corev1.PodSpec{Hostname: "db-1", Subdomain: "db-headless"},
		Status:     corev1.PodStatus{PodIP: "127.88.0.2", Conditions: []corev1.PodCondition{ready}},
	}
	pending := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "db-2", Namespace: "ns"}}
	p := &provider{pods: map[string]*podRuntime{}, peerPods: map[string][]*corev1.Pod{"b": {peer, pending}}}
	entries, _ := p.hostsEntries()
	if len(entries) != 1 {
		t.Fatalf("entries %+v, want the one peer pod with an address", entries)
	}
	got := entries[0]
	if got.ip != "127.88.0.2" || !got.ready || got.hostname != "db-1" || got.subdomain != "db-headless" {
		t.Errorf("entry %+v", got)
	}
}

func TestAReadOnlyRootLeavesOnlyTheVolumesWritable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (namespaces and mounts)")
	}
	dir := t.TempDir()
	var rootStat, dirStat syscall.Stat_t
	if syscall.Stat("/", &rootStat) != nil || syscall.Stat(dir, &dirStat) != nil || rootStat.Dev != dirStat.Dev {
		t.Skip("the temporary directory is not on the root filesystem")
	}
	path := func(name string) string { return filepath.Join(dir, name) }
	// image-run: an image directory with a volume inside it (its mount point made in it);
	// image-tmp: an image directory with a volume over it.
	for _, name := range []string{"volume", "image-run", "image-tmp", "volume-tmp"} {
		if err := os.Mkdir(path(name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	log, err := os.Create(path("log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	// As root, so that only the mounts' flags can refuse a write.
	try := func(file string) string {
		return `touch ` + file + ` 2>/dev/null && echo ` + filepath.Base(file) + `; `
	}
	script := try(path("on-root")) + try(path("image-run/in-image")) +
		try(path("image-run/volume/in-volume")) + try(path("image-tmp/in-tmp-volume"))
	proc, err := startProcess(containerSpec{
		Argv: []string{"sh", "-c", script}, Env: []string{"PATH=" + standardPath},
		WorkDir: "/", Hostname: "pod-ro", ReadOnlyRoot: true,
		Mounts: []mountSpec{
			{Source: path("image-run"), Target: path("image-run"), ImageRoot: true},
			{Source: path("volume"), Target: path("image-run/volume")},
			{Source: path("image-tmp"), Target: path("image-tmp"), ImageRoot: true},
			{Source: path("volume-tmp"), Target: path("image-tmp")},
		},
	}, log, false)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	proc.wait()
	output, _ := os.ReadFile(log.Name())
	if string(output) != "in-volume\nin-tmp-volume\n" {
		t.Errorf("written: %q", output)
	}
}
