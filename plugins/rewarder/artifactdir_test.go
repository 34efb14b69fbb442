package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestPathRefused checks which failures to make artifact_dir blame the
// operator's path (not retried) and which the disk (retried).
func TestPathRefused(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	underFile := os.MkdirAll(filepath.Join(file, "art"), 0o755)
	if underFile == nil || !pathRefused(underFile) {
		t.Errorf("MkdirAll under a file = %v, want an error that blames the path", underFile)
	}
	full := &fs.PathError{Op: "mkdir", Path: filepath.Join(dir, "art"), Err: syscall.ENOSPC}
	if pathRefused(full) {
		t.Errorf("pathRefused(%v) = true, want false: a full disk passes", full)
	}
}
