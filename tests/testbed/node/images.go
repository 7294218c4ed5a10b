package main

// Images map to local programs: the one table that says what each image runs on this node.
// tests/testbed/README.md documents it; keep the two in step.

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

const standardPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// imageConfig is what an image would bring: its entrypoint and command, environment, user,
// working directory, and the files it places in the container.
type imageConfig struct {
	entrypoint []string
	cmd        []string
	env        []string
	workDir    string
	uid, gid   int64
	// files from this machine mounted into the container, by path in the container.
	files map[string]string
	// extra /etc/passwd and /etc/group lines, for the image's own users.
	passwd, group []string
	// imageID names what the image was mapped to, for the container status.
	imageID string
}

// errImageNotMapped is a pull error: the pod waits with ErrImagePull, as a kubelet's would.
type errImageNotMapped struct{ message string }

func (e errImageNotMapped) Error() string { return e.message }

type imageResolver struct{ cfg config }

var postgresTag = regexp.MustCompile(`^([0-9]+)(\.[0-9]+)?([-.].*)?$`)

// resolve maps an image reference to a local program:
//
//	<any registry>/postgres:<major>[...]  PostgreSQL <major> from /usr/lib/postgresql/<major>/bin,
//	                                     with the official image's entrypoint behaviour
//	<any registry>/pgkube:<any tag>       the pgkube binary built from this checkout
//	<any registry>/busybox:<any tag>      the host's shell and tools
func (r imageResolver) resolve(image string) (imageConfig, error) {
	repository, tag := splitImage(image)
	switch filepath.Base(repository) {
	case "postgres":
		return r.postgres(image, tag)
	case "pgkube":
		return r.pgkube(image)
	case "busybox":
		return imageConfig{
			cmd: []string{"sh"}, env: []string{"PATH=" + standardPath}, workDir: "/",
			imageID: "testbed-local://host-shell",
		}, nil
	}
	return imageConfig{}, errImageNotMapped{fmt.Sprintf(
		"image %q is not mapped to a local program on this test bed node (mapped: postgres:<major>, pgkube:<tag>, busybox:<tag>; see tests/testbed/README.md)",
		image)}
}

func (r imageResolver) postgres(image, tag string) (imageConfig, error) {
	match := postgresTag.FindStringSubmatch(tag)
	if match == nil {
		return imageConfig{}, errImageNotMapped{fmt.Sprintf(
			"image %q: the test bed maps postgres images by their major version tag (postgres:15), not %q", image, tag)}
	}
	major := match[1]
	bin := filepath.Join(r.cfg.postgresLibs, major, "bin")
	if _, err := os.Stat(filepath.Join(bin, "postgres")); err != nil {
		return imageConfig{}, errImageNotMapped{fmt.Sprintf(
			"image %q needs PostgreSQL %s, which is not installed on this machine (installed: %s)",
			image, major, strings.Join(installedPostgres(r.cfg.postgresLibs), ", "))}
	}
	return imageConfig{
		entrypoint: []string{"docker-entrypoint.sh"},
		cmd:        []string{"postgres"},
		env: []string{
			"PATH=" + bin + ":" + standardPath,
			"PG_MAJOR=" + major,
			"PGDATA=/var/lib/postgresql/data",
			// The official image generates en_US.utf8; C.UTF-8 is always present on Debian.
			"LANG=C.UTF-8",
		},
		workDir: "/",
		files: map[string]string{
			"/usr/local/bin/docker-entrypoint.sh": filepath.Join(r.cfg.imagesDir, "postgres-entrypoint.sh"),
		},
		passwd:  []string{"postgres:x:999:999:PostgreSQL:/var/lib/postgresql:/bin/bash"},
		group:   []string{"postgres:x:999:"},
		imageID: "testbed-local://" + bin,
	}, nil
}

func (r imageResolver) pgkube(image string) (imageConfig, error) {
	if r.cfg.pgkubeBinary == "" {
		return imageConfig{}, errImageNotMapped{fmt.Sprintf("image %q: the node agent was started without --pgkube-binary", image)}
	}
	if _, err := os.Stat(r.cfg.pgkubeBinary); err != nil {
		return imageConfig{}, errImageNotMapped{fmt.Sprintf(
			"image %q runs the pgkube binary built from the checkout, and %s is not built yet (cargo build)", image, r.cfg.pgkubeBinary)}
	}
	return imageConfig{
		entrypoint: []string{"/usr/local/bin/pgkube"},
		cmd:        []string{"run"},
		env:        []string{"PATH=" + standardPath},
		workDir:    "/",
		// The image's user: distroless "nonroot".
		uid: 65532, gid: 65532,
		files:   map[string]string{"/usr/local/bin/pgkube": r.cfg.pgkubeBinary},
		passwd:  []string{"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin"},
		group:   []string{"nonroot:x:65532:"},
		imageID: "testbed-local://" + r.cfg.pgkubeBinary,
	}, nil
}

// splitImage splits `registry/path/name:tag@digest` into repository and tag ("latest" if none).
func splitImage(image string) (repository, tag string) {
	if at := strings.Index(image, "@"); at >= 0 {
		image = image[:at]
	}
	slash := strings.LastIndex(image, "/")
	if colon := strings.LastIndex(image, ":"); colon > slash {
		return image[:colon], image[colon+1:]
	}
	return image, "latest"
}

func installedPostgres(root string) []string {
	entries, _ := os.ReadDir(root)
	var majors []string
	for _, entry := range entries {
		if _, err := os.Stat(filepath.Join(root, entry.Name(), "bin", "postgres")); err == nil {
			majors = append(majors, entry.Name())
		}
	}
	sort.Strings(majors)
	if len(majors) == 0 {
		return []string{"none"}
	}
	return majors
}
