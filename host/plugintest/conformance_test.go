package plugintest_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plughost/plughost/host/plugintest"
)

// targetEnv makes the test binary run Conformance on one faulty plugin, as
// a child of TestConformanceCatchesFaults.
const targetEnv = "PLUGINTEST_KIT_TARGET"

var binDir string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if dir := os.Getenv(targetEnv + "_BIN"); dir != "" {
		binDir = dir // a child: the parent built everything
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "plugintest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	pkgs := map[string]string{"hello": "../../plugins/hello"}
	for _, n := range []string{"nodrain", "crashy", "mismatch", "badmetrics", "forgetful"} {
		pkgs[n] = "./testdata/plugins/" + n
	}
	for name, pkg := range pkgs {
		if b, err := exec.Command("go", "build", "-o", filepath.Join(dir, name), pkg).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build %s: %v\n%s", pkg, err, b)
			return 1
		}
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

func TestConformanceHello(t *testing.T) {
	plugintest.Conformance(t, filepath.Join(binDir, "hello"), `greeting = "hi"`,
		plugintest.InFlight("GET /sleep?ms=300"))
}

// faults are plugins built to break one rule each, the subtest that must
// catch it, and what its message must say.
var faults = []struct {
	plugin  string
	config  string
	opts    []plugintest.Option
	subtest string
	message string
}{
	{"nodrain", "", []plugintest.Option{plugintest.InFlight("GET /work"), plugintest.DrainDeadline(500 * time.Millisecond)},
		"TestConformanceCatchesFaults/drain", "Drain did not return by its deadline"},
	{"crashy", "", nil, "TestConformanceCatchesFaults/malformed_requests", "the plugin process died"},
	{"mismatch", "size = 3", nil, "TestConformanceCatchesFaults/config", "The schema and the Configure hook disagree"},
	{"badmetrics", "", nil, "TestConformanceCatchesFaults/metrics", `reserved for the host`},
	{"badmetrics", "", nil, "TestConformanceCatchesFaults/metrics", `_total`},
	{"forgetful", "", []plugintest.Option{plugintest.Durability(putItem, getItem)},
		"TestConformanceCatchesFaults/durability", "acknowledged writes lost after kill -9"},
}

// putItem and getItem are the durability check's write and read for
// forgetful.
func putItem(ctx context.Context, do plugintest.Do, i int) error {
	code, body, err := do(ctx, "PUT", fmt.Sprintf("/items/%d", i), nil, nil)
	if err == nil && code != http.StatusNoContent {
		err = fmt.Errorf("PUT answered %d %s", code, body)
	}
	return err
}

func getItem(ctx context.Context, do plugintest.Do, i int) error {
	code, body, err := do(ctx, "GET", fmt.Sprintf("/items/%d", i), nil, nil)
	if err == nil && code != http.StatusNoContent {
		err = fmt.Errorf("GET answered %d %s", code, body)
	}
	return err
}

// TestConformanceCatchesFaults runs Conformance on each faulty plugin in a
// child test process, since a Conformance failure fails its *testing.T,
// and checks that the right subtest failed with a helpful message.
func TestConformanceCatchesFaults(t *testing.T) {
	if target := os.Getenv(targetEnv); target != "" {
		for _, f := range faults {
			if f.plugin == target {
				plugintest.Conformance(t, filepath.Join(binDir, f.plugin), f.config, f.opts...)
				return
			}
		}
		t.Fatalf("unknown target %q", target)
	}
	outputs := map[string]string{}
	for _, f := range faults {
		t.Run(f.plugin+"/"+strings.TrimPrefix(f.subtest, "TestConformanceCatchesFaults/"), func(t *testing.T) {
			out, ok := outputs[f.plugin]
			if !ok {
				cmd := exec.Command(os.Args[0], "-test.run=^TestConformanceCatchesFaults$", "-test.v", "-test.count=1")
				cmd.Env = append(os.Environ(), targetEnv+"="+f.plugin, targetEnv+"_BIN="+binDir)
				b, err := cmd.CombinedOutput()
				if err == nil {
					t.Fatalf("Conformance passed the faulty plugin %s; want a failure in %s\n%s", f.plugin, f.subtest, b)
				}
				out = string(b)
				outputs[f.plugin] = out
			}
			if !strings.Contains(out, "--- FAIL: "+f.subtest+" ") {
				t.Errorf("Conformance on %s: subtest %s did not fail\n%s", f.plugin, f.subtest, out)
			}
			if !strings.Contains(out, f.message) {
				t.Errorf("Conformance on %s: output lacks %q\n%s", f.plugin, f.message, out)
			}
		})
	}
}
