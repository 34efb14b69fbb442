package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"go.uber.org/goleak"

	"github.com/plughost/plughost/host/config"
	"github.com/plughost/plughost/host/internal/testbin"
	"github.com/plughost/plughost/sdk/wire"
)

// bin is the directory TestMain builds the plugin binaries into.
var bin string

func TestMain(m *testing.M) {
	// os/signal starts one goroutine on the first signal.Notify, in serve,
	// and keeps it for the life of the process.
	goleak.VerifyTestMain(testbin.BuildFirst(m, "main", &bin,
		"./plugins/hello",
		"./host/e2e/testdata/plugins/crasher",
		"./host/e2e/testdata/plugins/badproto",
	), goleak.IgnoreAnyFunction("os/signal.loop"))
}

// runCmd runs the command line in-process and returns its outputs.
func runCmd(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut testbin.SyncBuffer
	err = run(t.Context(), args, &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestCommandLine(t *testing.T) {
	versionRE := regexp.MustCompile(`^plughost dev \(plugin protocol ` + strconv.Itoa(wire.ProtocolVersion) + `, ` + regexp.QuoteMeta(runtime.Version()) + `\)\n$`)
	tests := []struct {
		name       string
		args       []string
		wantErr    bool
		wantStdout *regexp.Regexp // nil: empty
		wantStderr []string       // substrings
	}{
		{name: "no arguments", args: nil, wantErr: true, wantStderr: []string{"usage:", "plughost run [-config FILE]", "plughost validate [-config FILE]", "-config defaults to config.hcl"}},
		{name: "version", args: []string{"version"}, wantStdout: versionRE},
		{name: "--version", args: []string{"--version"}, wantStdout: versionRE},
		{name: "help", args: []string{"help"}, wantStdout: regexp.MustCompile(`^usage:\n(.|\n)*plughost version\n(.|\n)*-config defaults to config.hcl`)},
		{name: "-h", args: []string{"-h"}, wantStdout: regexp.MustCompile(`^usage:\n(.|\n)*-config defaults to config.hcl`)},
		{name: "run -h", args: []string{"run", "-h"}, wantStdout: regexp.MustCompile(`^usage of plughost run:\n(.|\n)*-config string\n\s+path of the HCL config file \(default "config.hcl"\)\n(.|\n)*-log-level`)},
		{name: "validate -help", args: []string{"validate", "-help"}, wantStdout: regexp.MustCompile(`^usage of plughost validate:\n(.|\n)*\(default "config.hcl"\)`)},
		{name: "unknown command", args: []string{"frob"}, wantErr: true, wantStderr: []string{`unknown command "frob"`, "usage:"}},
		{name: "unknown flag for validate", args: []string{"validate", "-bogus"}, wantErr: true, wantStderr: []string{"flag provided but not defined: -bogus", "usage of plughost validate:", `(default "config.hcl")`}},
		{name: "unknown flag for run", args: []string{"run", "-frob=1"}, wantErr: true, wantStderr: []string{"flag provided but not defined: -frob"}},
		{name: "flag without value", args: []string{"validate", "-config"}, wantErr: true, wantStderr: []string{"flag needs an argument: -config"}},
		{name: "extra arguments", args: []string{"validate", "-config", "x.hcl", "extra"}, wantErr: true, wantStderr: []string{"unexpected arguments: [extra]", "usage:"}},
		{name: "unknown log level", args: []string{"run", "-log-level", "loud"}, wantErr: true, wantStderr: []string{`unknown -log-level "loud"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, err := runCmd(t, tt.args...)
			if tt.wantErr {
				if !errors.Is(err, errReported) {
					t.Errorf("run(%q) = %v, want errReported (already printed)", tt.args, err)
				}
			} else if err != nil {
				t.Errorf("run(%q) = %v, want nil", tt.args, err)
			}
			if tt.wantStdout == nil && stdout != "" {
				t.Errorf("run(%q) stdout = %q, want nothing", tt.args, stdout)
			}
			if tt.wantStdout != nil && !tt.wantStdout.MatchString(stdout) {
				t.Errorf("run(%q) stdout = %q, want it to match %s", tt.args, stdout, tt.wantStdout)
			}
			for _, w := range tt.wantStderr {
				if !strings.Contains(stderr, w) {
					t.Errorf("run(%q) stderr = %q, want it to contain %q", tt.args, stderr, w)
				}
			}
		})
	}
}

// writeConfig writes a config file whose plugin_dir is the built plugins.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	src := fmt.Sprintf("plugin_dir = %q\ndata_dir = %q\n", bin, filepath.Join(dir, "data")) + body
	p := filepath.Join(dir, "plughost.hcl")
	if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// lineOf returns the 1-based line of the config file at path that holds s.
func lineOf(t *testing.T, path, s string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			return i + 1
		}
	}
	t.Fatalf("%s has no line containing %q", path, s)
	return 0
}

func TestValidateGood(t *testing.T) {
	cfg := writeConfig(t, `
plugin "hello" {
  path = "hello"
  config {
    greeting = "hi"
  }
}

plugin "other" {
  path  = "hello"
  mount = "/other"
}
`)
	stdout, stderr, err := runCmd(t, "validate", "-config", cfg)
	if err != nil {
		t.Fatalf("validate %s = %v, want nil; stderr:\n%s", cfg, err, stderr)
	}
	if want := cfg + ": valid (2 plugins)\n"; stdout != want {
		t.Errorf("validate stdout = %q, want %q", stdout, want)
	}
	// Nothing else either: no log records of the plugins it launched.
	if stderr != "" {
		t.Errorf("validate stderr = %q, want nothing", stderr)
	}
}

// TestValidateOutputIsDiagnostics checks that validate prints its
// diagnostics and summary and nothing else, warnings included, and that
// -log-level brings the host's records back.
func TestValidateOutputIsDiagnostics(t *testing.T) {
	cfg := writeConfig(t, `
plugin "hello" {
  path = "hello"
  env {
    gogc = "800"
  }
}
`)
	c, diags := config.Load(cfg)
	if len(diags) != 1 || diags[0].Severity != hcl.DiagWarning {
		t.Fatalf("config.Load(%s) diagnostics = %v, want one warning", cfg, diags)
	}
	var want bytes.Buffer
	if err := config.WriteDiagnostics(&want, c.Files, diags); err != nil {
		t.Fatal(err)
	}

	stdout, stderr, err := runCmd(t, "validate", "-config", cfg)
	if err != nil {
		t.Fatalf("validate %s = %v, want nil; stderr:\n%s", cfg, err, stderr)
	}
	if want := cfg + ": valid (1 plugin)\n"; stdout != want {
		t.Errorf("validate stdout = %q, want %q", stdout, want)
	}
	if stderr != want.String() {
		t.Errorf("validate stderr =\n%s\nwant exactly the diagnostics:\n%s", stderr, want.String())
	}

	// The checked plugin's exit is no news: at debug, as what it is.
	_, stderr, err = runCmd(t, "validate", "-log-level", "info", "-config", cfg)
	if err != nil {
		t.Fatalf("validate -log-level info %s = %v, want nil", cfg, err)
	}
	if strings.Contains(stderr, "plugin process exited") {
		t.Errorf("validate -log-level info stderr = %q, want no record of the checked plugin's exit", stderr)
	}
	_, stderr, err = runCmd(t, "validate", "-log-level", "debug", "-config", cfg)
	if err != nil {
		t.Fatalf("validate -log-level debug %s = %v, want nil", cfg, err)
	}
	if !strings.Contains(stderr, "[DEBUG] plughost.hello: checked plugin process exited") {
		t.Errorf("validate -log-level debug stderr = %q, want go-plugin's records too, its exit as a checked plugin's", stderr)
	}
}

func TestValidateBad(t *testing.T) {
	noExec := filepath.Join(t.TempDir(), "noexec")
	if err := os.WriteFile(noExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		body    string // appended to the plugin_dir and data_dir lines
		at      string // text on the line the diagnostic must point at
		want    []string
		alsoRun bool // run must refuse it too, before listening
	}{
		{
			name:    "invalid listen address",
			body:    "listen = \"localhost\"\n",
			at:      "listen = ",
			want:    []string{"Error: Invalid listen address"},
			alsoRun: true,
		},
		{
			name:    "unknown top-level attribute",
			body:    "colour = \"blue\"\n",
			at:      "colour",
			want:    []string{"Unsupported argument"},
			alsoRun: true,
		},
		{
			name:    "syntax error",
			body:    "plugin \"hello\" {\n  path = \n}\n",
			at:      "path =",
			want:    []string{"Error:"},
			alsoRun: true,
		},
		{
			name:    "missing binary",
			body:    "plugin \"hello\" {\n  path = \"nope\"\n}\n",
			at:      `path = "nope"`,
			want:    []string{"Unusable plugin binary", `plugin "hello"`},
			alsoRun: true,
		},
		{
			name:    "binary not executable",
			body:    fmt.Sprintf("plugin \"hello\" {\n  path = %q\n}\n", noExec),
			at:      "path =",
			want:    []string{"Unusable plugin binary", "not executable"},
			alsoRun: true,
		},
		{
			name:    "checksum mismatch",
			body:    "plugin \"hello\" {\n  path   = \"hello\"\n  sha256 = \"" + strings.Repeat("0", 64) + "\"\n}\n",
			at:      "sha256",
			want:    []string{"Plugin checksum mismatch", "refusing to start it"},
			alsoRun: true,
		},
		{
			name: "unknown plugin config attribute",
			body: "plugin \"hello\" {\n  path = \"hello\"\n  config {\n    greeting = \"hi\"\n    colour   = \"blue\"\n  }\n}\n",
			at:   "colour",
			want: []string{"Unsupported argument", "colour"},
		},
		{
			name: "plugin exits at once",
			body: "plugin \"broken\" {\n  path = \"crasher\"\n}\n",
			at:   `path = "crasher"`,
			want: []string{"Plugin did not start", `plugin "broken"`, "handshake"},
		},
		{
			name: "plugin speaks another protocol",
			body: "plugin \"old\" {\n  path = \"badproto\"\n}\n",
			at:   `path = "badproto"`,
			want: []string{"Plugin did not start", "the plugin speaks plughost plugin protocol 1, this host speaks protocol 2"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := writeConfig(t, tt.body)
			loc := fmt.Sprintf("%s:%d:", cfg, lineOf(t, cfg, tt.at))
			cmds := []string{"validate"}
			if tt.alsoRun {
				cmds = append(cmds, "run")
			}
			for _, cmd := range cmds {
				stdout, stderr, err := runCmd(t, cmd, "-config", cfg)
				if !errors.Is(err, errReported) {
					t.Errorf("%s %s = %v, want errReported", cmd, tt.name, err)
				}
				if stdout != "" {
					t.Errorf("%s %s stdout = %q, want nothing", cmd, tt.name, stdout)
				}
				if !strings.Contains(stderr, loc) {
					t.Errorf("%s %s stderr = %s\nwant a diagnostic at %s", cmd, tt.name, stderr, loc)
				}
				for _, w := range tt.want {
					if !strings.Contains(stderr, w) {
						t.Errorf("%s %s stderr = %s\nwant it to contain %q", cmd, tt.name, stderr, w)
					}
				}
			}
		})
	}

	t.Run("missing file", func(t *testing.T) {
		cfg := filepath.Join(t.TempDir(), "nope.hcl")
		for _, cmd := range []string{"validate", "run"} {
			_, stderr, err := runCmd(t, cmd, "-config", cfg)
			if !errors.Is(err, errReported) {
				t.Errorf("%s -config %s = %v, want errReported", cmd, cfg, err)
			}
			if want := cfg + ":1:1: Error: Cannot read config file"; !strings.Contains(stderr, want) {
				t.Errorf("%s -config %s stderr = %s\nwant it to contain %q", cmd, cfg, stderr, want)
			}
		}
	})
}

// logRecord is one -log-json line.
type logRecord map[string]any

// waitLog polls the JSON log for a record with this message.
func waitLog(t *testing.T, log *testbin.SyncBuffer, done <-chan struct{}, msg string) logRecord {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		sc := bufio.NewScanner(strings.NewReader(log.String()))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var rec logRecord
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["@message"] == msg {
				return rec
			}
		}
		select {
		case <-done:
			t.Fatalf("run returned before logging %q", msg)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("no %q log record within 60s", msg)
	return nil
}

func TestRunServesUntilContextDone(t *testing.T) {
	cfg := writeConfig(t, `
listen         = "127.0.0.1:0"
drain_deadline = "2s"
admin {
  listen = "127.0.0.1:0"
}
plugin "hello" {
  path = "hello"
  config {
    greeting = "hi from run"
  }
}
`)
	var stdout, stderr testbin.SyncBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("host log:\n%s", stderr.String())
		}
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var runErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		runErr = run(ctx, []string{"run", "-config", cfg, "-log-json", "-log-level", "debug"}, &stdout, &stderr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("run did not return within 30s of its context being cancelled")
		}
	})

	rec := waitLog(t, &stderr, done, "plughost running")
	ingressURL := fmt.Sprintf("http://%s", rec["listen"])
	adminURL := fmt.Sprintf("http://%s", rec["admin"])
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := client.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		return resp.StatusCode, string(b)
	}

	var code int
	var body string
	deadline := time.Now().Add(30 * time.Second)
	for code, body = get(ingressURL + "/hello/"); code != http.StatusOK && time.Now().Before(deadline); code, body = get(ingressURL + "/hello/") {
		time.Sleep(20 * time.Millisecond)
	}
	if code != http.StatusOK || !strings.Contains(body, `"greeting":"hi from run"`) {
		t.Fatalf("GET /hello/ = %d %s, want 200 with the configured greeting", code, body)
	}
	if code, body := get(ingressURL + "/readyz"); code != http.StatusOK {
		t.Errorf("GET /readyz = %d %s, want 200", code, body)
	}

	code, body = get(adminURL + "/v1/plugins")
	var plugins []struct {
		Name  string `json:"name"`
		State string `json:"state"`
		Pid   int    `json:"pid"`
	}
	if err := json.Unmarshal([]byte(body), &plugins); code != http.StatusOK || err != nil || len(plugins) != 1 || plugins[0].State != "ready" {
		t.Fatalf("GET admin /v1/plugins = %d %s (%v), want hello ready", code, body, err)
	}
	pid := plugins[0].Pid
	if code, body := get(adminURL + "/metrics"); code != http.StatusOK || !strings.Contains(body, `plughost_plugin_up{plugin="hello"} 1`) {
		t.Errorf("GET admin /metrics = %d, want 200 with plughost_plugin_up{plugin=\"hello\"} 1", code)
	}

	cancel()
	select {
	case <-done:
		if runErr != nil {
			t.Errorf("run after its context was cancelled = %v, want nil", runErr)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return within 30s of its context being cancelled")
	}
	if syscall.Kill(pid, 0) == nil {
		t.Errorf("plugin process %d still exists after run returned", pid)
	}
	if !strings.Contains(stderr.String(), "shutdown complete") {
		t.Errorf("host log has no %q record", "shutdown complete")
	}
}
