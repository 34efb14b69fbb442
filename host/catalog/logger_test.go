package catalog_test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/host/catalog"
	"github.com/plughost/plughost/host/internal/testbin"
)

// logKeyRE matches one key=value pair of hclog's text format; a value with
// spaces is quoted.
var logKeyRE = regexp.MustCompile(`\s([A-Za-z_@][A-Za-z0-9_.@-]*)=("(?:[^"\\]|\\.)*"|\S*)`)

// duplicateKeys returns the keys that appear more than once in one record
// of log, hclog text, with the record.
func duplicateKeys(log string) map[string]string {
	dups := map[string]string{}
	for _, line := range strings.Split(log, "\n") {
		seen := map[string]bool{}
		for _, m := range logKeyRE.FindAllStringSubmatch(line, -1) {
			if seen[m[1]] {
				dups[m[1]] = line
			}
			seen[m[1]] = true
		}
	}
	return dups
}

func TestDuplicateKeys(t *testing.T) {
	for _, tt := range []struct {
		line string
		want bool
	}{
		{`2026-01-01T00:00:00.000Z [INFO]  h.a: plugin process exited: plugin=a path=/bin/a id=1`, false},
		{`2026-01-01T00:00:00.000Z [INFO]  h.a: plugin process exited: plugin=a plugin=/bin/a id=1`, true},
		{`2026-01-01T00:00:00.000Z [INFO]  h.a: plugin output: plugin=a stream=stdout line="plugin=x y"`, false},
	} {
		if got := len(duplicateKeys(tt.line)) > 0; got != tt.want {
			t.Errorf("duplicateKeys(%q) found some = %v, want %v", tt.line, got, tt.want)
		}
	}
}

// TestLogKeysOnce launches a plugin with a logger tagged as the supervisor
// tags it, configures it, kills it, and checks that no record of the
// launch, the plugin's output or go-plugin's own carries a key twice.
func TestLogKeysOnce(t *testing.T) {
	buf := &testbin.SyncBuffer{}
	root := hclog.New(&hclog.LoggerOptions{Name: "plughost", Level: hclog.Trace, Output: buf})
	logger := root.Named("envdump").With("plugin", "envdump")

	inst := launch(t, "envdump", catalog.Options{Logger: logger})
	if err := inst.Configure(t.Context(), "envdump", nil, t.TempDir(), nil); err != nil {
		t.Fatalf("Configure() = %v, want nil", err)
	}
	waitFor(t, 10*time.Second, "the plugin's output in the log", func() bool {
		return strings.Contains(buf.String(), "envdump: done")
	})
	inst.Kill()

	log := buf.String()
	if !strings.Contains(log, "plugin process exited") {
		t.Fatalf("log has no \"plugin process exited\" record of go-plugin's:\n%s", log)
	}
	for k, line := range duplicateKeys(log) {
		t.Errorf("record carries %s twice: %s", k, line)
	}
	if !regexp.MustCompile(`plugin process exited: plugin=envdump path=\S*envdump`).MatchString(log) {
		t.Errorf("log = %s, want go-plugin's exit record with plugin=envdump path=PATH", log)
	}
}

// TestCheckLaunchExit: a launch that only checks the plugin logs its
// process's clean exit at debug, as what it is; a plugin's own launch
// still logs it at info.
func TestCheckLaunchExit(t *testing.T) {
	for _, tt := range []struct {
		check bool
		want  string
	}{
		{false, "[INFO]  plughost.hello: plugin process exited: plugin=hello path="},
		{true, "[DEBUG] plughost.hello: checked plugin process exited: plugin=hello path="},
	} {
		buf := &testbin.SyncBuffer{}
		root := hclog.New(&hclog.LoggerOptions{Name: "plughost", Level: hclog.Debug, Output: buf})
		inst := launch(t, "hello", catalog.Options{Logger: root.Named("hello").With("plugin", "hello"), Check: tt.check})
		inst.Kill()
		log := buf.String()
		if !strings.Contains(log, tt.want) {
			t.Errorf("Launch(hello, Check: %t) then Kill: log has no %q:\n%s", tt.check, tt.want, log)
		}
		if other := strings.Count(log, "plugin process exited"); other != 1 {
			t.Errorf("Launch(hello, Check: %t) then Kill: %d records of the exit, want 1:\n%s", tt.check, other, log)
		}
	}
}
