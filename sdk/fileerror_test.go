package sdk_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/plughost/plughost/sdk"
)

// TestFileConfigError checks which failures blame the config value (the
// host leaves the plugin failed) and which the file system (retried).
func TestFileConfigError(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, missing := os.ReadFile(filepath.Join(dir, "missing"))
	_, isDir := os.ReadFile(dir)
	underFile := os.MkdirAll(filepath.Join(file, "sub"), 0o755)
	tests := []struct {
		name  string
		err   error
		blame bool
	}{
		{"a missing file", missing, false},
		{"a full disk", &fs.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOSPC}, false},
		{"an I/O error", &fs.PathError{Op: "read", Path: file, Err: syscall.EIO}, false},
		{"a directory read as a file", isDir, true},
		{"a directory under a file", underFile, true},
		{"permission denied", &fs.PathError{Op: "open", Path: file, Err: syscall.EACCES}, true},
		{"a read-only file system", &fs.PathError{Op: "mkdir", Path: dir, Err: syscall.EROFS}, true},
		{"content refused", errors.New("root key: 3 bytes, want at least 32"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.err == nil {
				t.Fatal("the file system gave no error to test")
			}
			ce := sdk.FileConfigError("key_file", tt.err)
			if blames := ce.Attribute == "key_file"; blames != tt.blame {
				t.Errorf("FileConfigError(%v) = %+v, blames the attribute: %t, want %t", tt.err, ce, blames, tt.blame)
			}
			if !tt.blame && ce.Attribute != "" {
				t.Errorf("FileConfigError(%v) names %q, want no attribute", tt.err, ce.Attribute)
			}
		})
	}
}
