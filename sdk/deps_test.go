package sdk_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoHostDependency keeps the arrow proto <- sdk <- host one way: no
// package of the SDK may depend on a package of the host.
func TestNoHostDependency(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps ./...: %v\n%s", err, out)
	}
	for dep := range strings.FieldsSeq(string(out)) {
		if strings.HasPrefix(dep, "github.com/plughost/plughost/host/") || strings.HasPrefix(dep, "github.com/plughost/plughost/plugins/") {
			t.Errorf("an SDK package depends on %s; the SDK must not import the host or a plugin", dep)
		}
	}
}
