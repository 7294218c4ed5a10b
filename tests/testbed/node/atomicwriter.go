package main

// The kubelet's atomic writer, for Secret, ConfigMap, downward API and projected volumes: the
// files live in a timestamped directory `..2006_01_02_15_04_05.NNNN`, a symlink `..data`
// points at it, and every top-level name of the volume is a symlink `name -> ..data/name`. An
// update writes a new timestamped directory and swaps `..data` with a rename, so a reader
// sees the old set of files or the new one, never half of each; the volume's directory itself
// stays (containers bind-mount it, and would not see a new one).

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

const (
	dataDirName    = "..data"
	newDataDirName = "..data_tmp"
)

// payloadFile is one file of a volume as it should be on disk.
type payloadFile struct {
	data []byte
	mode fs.FileMode
}

// volumePayload turns the files of a volume into paths relative to the volume, with their
// modes (the item's, else the volume's default, else 0644). A later file of the same path wins.
func volumePayload(files []volumeFile, defaultMode *int32) (map[string]payloadFile, error) {
	payload := make(map[string]payloadFile, len(files))
	for _, file := range files {
		path := strings.TrimPrefix(filepath.Clean("/"+file.path), "/")
		if path == "" || strings.HasPrefix(path, "..") {
			return nil, fmt.Errorf("invalid path %q in the volume", file.path)
		}
		mode := fs.FileMode(defaultVolumeFileMode)
		if defaultMode != nil {
			mode = fs.FileMode(*defaultMode)
		}
		if file.mode != nil {
			mode = fs.FileMode(*file.mode)
		}
		payload[path] = payloadFile{data: file.data, mode: mode.Perm()}
	}
	return payload, nil
}

// writeAtomically makes dir hold exactly payload, the kubelet's way (see above). Files are
// owned by root and, with an fsGroup, by that group. It does nothing when the content and
// modes on disk already match, and says whether it wrote.
func writeAtomically(dir string, payload map[string]payloadFile, fsGroup *int64) (bool, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	oldTsDir, err := os.Readlink(filepath.Join(dir, dataDirName))
	if err != nil && !os.IsNotExist(err) {
		return false, err
	}
	var oldPaths []string
	if oldTsDir != "" {
		current, paths, err := readPayload(filepath.Join(dir, oldTsDir))
		if err != nil {
			return false, err
		}
		if payloadsEqual(current, payload) {
			return false, createVisibleLinks(dir, payload)
		}
		oldPaths = paths
	}

	tsDir, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		return false, err
	}
	if err := writePayload(tsDir, payload, fsGroup); err != nil {
		_ = os.RemoveAll(tsDir)
		return false, err
	}
	newLink := filepath.Join(dir, newDataDirName)
	_ = os.Remove(newLink)
	if err := os.Symlink(filepath.Base(tsDir), newLink); err != nil {
		_ = os.RemoveAll(tsDir)
		return false, err
	}
	if err := os.Rename(newLink, filepath.Join(dir, dataDirName)); err != nil {
		_ = os.Remove(newLink)
		_ = os.RemoveAll(tsDir)
		return false, err
	}
	if err := createVisibleLinks(dir, payload); err != nil {
		return true, err
	}
	if err := removeVisibleLinks(dir, oldPaths, payload); err != nil {
		return true, err
	}
	if oldTsDir != "" {
		if err := os.RemoveAll(filepath.Join(dir, oldTsDir)); err != nil {
			return true, err
		}
	}
	return true, nil
}

func writePayload(tsDir string, payload map[string]payloadFile, fsGroup *int64) error {
	if err := os.Chmod(tsDir, 0o755); err != nil {
		return err
	}
	for path, file := range payload {
		full := filepath.Join(tsDir, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, file.data, file.mode); err != nil {
			return err
		}
		// WriteFile's mode passes through the umask.
		if err := os.Chmod(full, file.mode); err != nil {
			return err
		}
		if fsGroup != nil {
			if err := os.Chown(full, 0, int(*fsGroup)); err != nil {
				return err
			}
		}
	}
	return nil
}

// readPayload reads the files of a timestamped directory, and every relative path in it
// (directories included).
func readPayload(tsDir string) (map[string]payloadFile, []string, error) {
	payload := map[string]payloadFile{}
	var paths []string
	err := filepath.WalkDir(tsDir, func(path string, entry fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(tsDir, path)
		if err != nil || rel == "." {
			return err
		}
		paths = append(paths, rel)
		if !entry.Type().IsRegular() {
			return nil
		}
		info, err := entry.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		payload[rel] = payloadFile{data: data, mode: info.Mode().Perm()}
		return nil
	})
	return payload, paths, err
}

func payloadsEqual(a, b map[string]payloadFile) bool {
	if len(a) != len(b) {
		return false
	}
	for path, file := range a {
		other, ok := b[path]
		if !ok || other.mode != file.mode || !bytes.Equal(other.data, file.data) {
			return false
		}
	}
	return true
}

func topLevel(path string) string {
	top, _, _ := strings.Cut(path, "/")
	return top
}

// createVisibleLinks makes `name -> ..data/name` for each top-level name of the payload.
func createVisibleLinks(dir string, payload map[string]payloadFile) error {
	for path := range payload {
		name := topLevel(path)
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		} else if !os.IsNotExist(err) {
			return err
		}
		if err := os.Symlink(filepath.Join(dataDirName, name), link); err != nil {
			return err
		}
	}
	return nil
}

// removeVisibleLinks removes the links of top-level names that the old content had and the
// new one does not.
func removeVisibleLinks(dir string, oldPaths []string, payload map[string]payloadFile) error {
	keep := map[string]bool{}
	for path := range payload {
		keep[topLevel(path)] = true
	}
	for _, path := range oldPaths {
		if strings.Contains(path, "/") || keep[path] {
			continue
		}
		link := filepath.Join(dir, path)
		if target, err := os.Readlink(link); err != nil || target != filepath.Join(dataDirName, path) {
			continue // not one of ours
		}
		if err := os.Remove(link); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	return nil
}
