package plugintest

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// Build compiles the plugin package pkg (a path such as "." or
// "./plugins/hello", relative to the test's working directory) into a
// temporary directory and returns the binary's path.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "plugin")
	cmd := exec.Command("go", "build", "-o", out, pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}
