package catalog_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/plughost/plughost/host/catalog"
	"github.com/plughost/plughost/host/dataplane"
	"github.com/plughost/plughost/host/internal/testbin"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/wire"
)

// bin is the directory TestMain builds the plugin binaries into.
var bin string

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testbin.BuildFirst(m, "catalog", &bin,
		"./plugins/hello",
		"./host/e2e/testdata/plugins/crasher",
		"./host/e2e/testdata/plugins/badproto",
		"./host/catalog/testdata/envdump",
	))
}

// testLogger returns a logger writing to a buffer that is printed when the
// test fails.
func testLogger(t *testing.T) (hclog.Logger, *testbin.SyncBuffer) {
	t.Helper()
	buf := &testbin.SyncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("plugin log:\n%s", buf.String())
		}
	})
	return hclog.New(&hclog.LoggerOptions{Name: "test", Level: hclog.Debug, Output: buf}), buf
}

// launch starts the named plugin binary and kills it when the test ends.
func launch(t *testing.T, name string, opts catalog.Options) *catalog.Instance {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger, _ = testLogger(t)
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 30 * time.Second
	}
	inst, err := catalog.Launch(t.Context(), filepath.Join(bin, name), "", opts)
	if err != nil {
		t.Fatalf("Launch(%s) = %v, want nil", name, err)
	}
	t.Cleanup(inst.Kill)
	return inst
}

// alive reports whether a process with this pid exists (a zombie counts).
func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// children returns the pids of this process's children, zombies included.
func children(t *testing.T) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Skipf("no /proc to list child processes: %v", err)
	}
	self := os.Getpid()
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 1 && fields[1] == strconv.Itoa(self) {
			out = append(out, pid)
		}
	}
	return out
}

// noNewChildren waits until every child process of the test process was
// already there before (in before).
func noNewChildren(t *testing.T, before []int) {
	t.Helper()
	var extra []int
	waitFor(t, 10*time.Second, "plugin processes to be gone", func() bool {
		extra = extra[:0]
		for _, pid := range children(t) {
			if !slices.Contains(before, pid) {
				extra = append(extra, pid)
			}
		}
		return len(extra) == 0
	})
}

func writeFile(t *testing.T, name string, data []byte, perm os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, perm); err != nil { // umask may have narrowed it
		t.Fatal(err)
	}
	return p
}

func sha(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

func TestVerify(t *testing.T) {
	content := []byte("#!/bin/sh\nexit 0\n")
	exe := writeFile(t, "exe", content, 0o755)
	noExec := writeFile(t, "noexec", content, 0o644)
	dir := t.TempDir()

	tests := []struct {
		name     string
		path     string
		want     string
		wantErr  string // substring; "" means no error
		checksum bool   // errors.Is(err, ErrChecksum)
		notExist bool   // errors.Is(err, fs.ErrNotExist)
	}{
		{name: "executable, no pin", path: exe},
		{name: "pin matches", path: exe, want: sha(content)},
		{name: "pin matches in upper case", path: exe, want: strings.ToUpper(sha(content))},
		{name: "pin mismatch", path: exe, want: sha([]byte("other")), wantErr: "checksum mismatch", checksum: true},
		{name: "missing file", path: filepath.Join(dir, "nope"), wantErr: "plugin binary", notExist: true},
		{name: "directory", path: dir, wantErr: "not a regular file"},
		{name: "not executable", path: noExec, wantErr: "not executable"},
		{name: "not executable with matching pin", path: noExec, want: sha(content), wantErr: "not executable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := catalog.Verify(tt.path, tt.want)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Verify(%q, %q) = %v, want nil", tt.path, tt.want, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Verify(%q, %q) = %v, want error containing %q", tt.path, tt.want, err, tt.wantErr)
			}
			if got := errors.Is(err, catalog.ErrChecksum); got != tt.checksum {
				t.Errorf("errors.Is(Verify(%q, %q), ErrChecksum) = %t, want %t", tt.path, tt.want, got, tt.checksum)
			}
			if got := errors.Is(err, fs.ErrNotExist); got != tt.notExist {
				t.Errorf("errors.Is(Verify(%q, %q), fs.ErrNotExist) = %t, want %t", tt.path, tt.want, got, tt.notExist)
			}
		})
	}
}

func TestFileSHA256(t *testing.T) {
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"abc", []byte("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		{"large", bytes.Repeat([]byte("plughost"), 1<<17), sha(bytes.Repeat([]byte("plughost"), 1<<17))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, "f", tt.data, 0o644)
			got, err := catalog.FileSHA256(p)
			if err != nil || got != tt.want {
				t.Errorf("FileSHA256(%q) = %q, %v, want %q, nil", p, got, err, tt.want)
			}
		})
	}
	t.Run("missing", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "nope")
		if got, err := catalog.FileSHA256(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("FileSHA256(%q) = %q, %v, want fs.ErrNotExist", p, got, err)
		}
	})
}

func TestLaunchHello(t *testing.T) {
	inst := launch(t, "hello", catalog.Options{})

	m := inst.Manifest()
	if m.GetName() != "hello" || m.GetVersion() != "0.1.0" {
		t.Errorf("Manifest() name, version = %q, %q, want %q, %q", m.GetName(), m.GetVersion(), "hello", "0.1.0")
	}
	wantRoutes := []*pluginv1.Route{
		{Method: "GET", Pattern: "/{$}"},
		{Method: "GET", Pattern: "/sleep", TimeoutMs: (10 * time.Minute).Milliseconds()},
	}
	if diff := cmp.Diff(wantRoutes, m.GetRoutes(), protocmp.Transform()); diff != "" {
		t.Errorf("Manifest().Routes mismatch (-want +got):\n%s", diff)
	}
	if attrs := m.GetConfigSchema().GetAttributes(); len(attrs) != 1 || attrs[0].GetName() != "greeting" {
		t.Errorf("Manifest().ConfigSchema.Attributes = %v, want one attribute named greeting", attrs)
	}

	pid := inst.Pid()
	if pid <= 0 {
		t.Fatalf("Pid() = %d, want > 0", pid)
	}
	if !alive(pid) {
		t.Fatalf("plugin process %d is not running after Launch", pid)
	}
	select {
	case <-inst.Exited():
		t.Fatal("Exited() is closed while the plugin runs")
	default:
	}

	// The plugin answers its control plane over gRPC and its requests
	// over the data plane.
	if err := inst.Configure(t.Context(), "hello", []byte(`{"greeting":"hi"}`), t.TempDir(), nil); err != nil {
		t.Fatalf("Configure() = %v, want nil", err)
	}
	code, body, err := get(t.Context(), inst.Transport(), "/")
	if err != nil {
		t.Fatalf("GET / over the data plane = %v, want nil", err)
	}
	if code != 200 || !strings.Contains(body, `"greeting":"hi"`) {
		t.Errorf("GET / over the data plane = %d %s, want 200 with greeting hi", code, body)
	}

	inst.Kill()
	select {
	case <-inst.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("Exited() not closed 10s after Kill returned")
	}
	waitFor(t, 10*time.Second, fmt.Sprintf("process %d to be gone", pid), func() bool { return !alive(pid) })
	inst.Kill() // a second Kill is harmless
}

// TestForceKillStopped: a process stopped with SIGSTOP answers nothing,
// not even go-plugin's shutdown RPC, so Kill would wait for it. ForceKill
// ends it at once, returns once it has been reaped, and closes Exited.
func TestForceKillStopped(t *testing.T) {
	inst := launch(t, "hello", catalog.Options{})
	pid := inst.Pid()
	done := make(chan struct{})
	reaped := false
	// Cleanups run last first: a stopped process left by a failing test
	// is SIGKILLed, which frees a ForceKill stuck on it, and that one is
	// waited for.
	t.Cleanup(func() { <-done })
	t.Cleanup(func() {
		if !reaped {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		close(done)
		t.Fatalf("kill -STOP %d: %v", pid, err)
	}

	start := time.Now()
	go func() {
		defer close(done)
		inst.ForceKill()
	}()
	// go-plugin waits 2s for a graceful exit, and the shutdown RPC before
	// that does not return while the process is stopped.
	const limit = time.Second
	select {
	case <-done:
	case <-time.After(5 * limit):
		t.Fatalf("ForceKill of a stopped process did not return within %v", 5*limit)
	}
	if d := time.Since(start); d > limit {
		t.Errorf("ForceKill of a stopped process took %v, want within %v: it must not wait for a graceful exit", d, limit)
	}
	if alive(pid) {
		t.Errorf("process %d exists (or is a zombie) after ForceKill returned, want it killed and reaped", pid)
	} else {
		reaped = true
	}
	select {
	case <-inst.Exited():
	default:
		t.Error("Exited() is open after ForceKill returned")
	}
}

func TestLaunchPinnedChecksum(t *testing.T) {
	path := filepath.Join(bin, "hello")
	sum, err := catalog.FileSHA256(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("match", func(t *testing.T) {
		logger, _ := testLogger(t)
		inst, err := catalog.Launch(t.Context(), path, sum, catalog.Options{Logger: logger, StartTimeout: 30 * time.Second})
		if err != nil {
			t.Fatalf("Launch(hello, its own sha256) = %v, want nil", err)
		}
		t.Cleanup(inst.Kill)
		if inst.Manifest().GetName() != "hello" {
			t.Errorf("Manifest().Name = %q, want hello", inst.Manifest().GetName())
		}
	})
	t.Run("mismatch", func(t *testing.T) {
		before := children(t)
		wrong := sha([]byte("not hello"))
		inst, err := catalog.Launch(t.Context(), path, wrong, catalog.Options{StartTimeout: 30 * time.Second})
		if err == nil {
			inst.Kill()
			t.Fatalf("Launch(hello, wrong sha256) = nil error, want ErrChecksum")
		}
		if !errors.Is(err, catalog.ErrChecksum) {
			t.Errorf("Launch(hello, wrong sha256) = %v, want errors.Is ErrChecksum", err)
		}
		noNewChildren(t, before)
	})
}

func TestLaunchFailures(t *testing.T) {
	// hang never completes the handshake, as a binary that is not a plugin
	// (or a wedged one) would.
	hang := writeFile(t, "hang", []byte("#!/bin/sh\nexec sleep 60\n"), 0o755)
	// chatty prints 330 lines of 32 bytes to stderr, then exits: the
	// error keeps the last 2 KiB of them, from a line's start.
	chatty := writeFile(t, "chatty", []byte("#!/bin/sh\nfor i in $(seq 1 330); do printf 'line %03d: cannot open the ledger\\n' $i >&2; done\nexit 1\n"), 0o755)

	tests := []struct {
		name    string
		path    string
		timeout time.Duration
		want    []string // substrings of the error
	}{
		{
			name:    "exits at once",
			path:    filepath.Join(bin, "crasher"),
			timeout: 30 * time.Second,
			want:    []string{"exited", "handshake", "sdk.Serve", `it printed to stderr: "crasher: exiting at once"`},
		},
		{
			name:    "built for protocol 1",
			path:    filepath.Join(bin, "badproto"),
			timeout: 30 * time.Second,
			want:    []string{"protocol mismatch", "the plugin speaks plughost plugin protocol 1", "this host speaks protocol 2", "rebuild the plugin"},
		},
		{
			name:    "says why at length before it exits",
			path:    chatty,
			timeout: 30 * time.Second,
			want:    []string{"not a plughost plugin", `it printed to stderr: "…`, `line 300: cannot open the ledger\n`, `line 330: cannot open the ledger"`},
		},
		{
			name:    "never completes the handshake",
			path:    hang,
			timeout: 300 * time.Millisecond,
			want:    []string{"did not complete the handshake in time"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logger, _ := testLogger(t)
			before := children(t)
			inst, err := catalog.Launch(t.Context(), tt.path, "", catalog.Options{Logger: logger, StartTimeout: tt.timeout})
			if err == nil {
				inst.Kill()
				t.Fatalf("Launch(%s) = nil error, want an error", tt.name)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Launch(%s) = %q, want it to contain %q", tt.name, err, w)
				}
			}
			if n := len(err.Error()); n > 3<<10 {
				t.Errorf("Launch(%s) error is %d bytes, want at most 3 KiB", tt.name, n)
			}
			noNewChildren(t, before)
		})
	}
}

func TestLaunchCancelled(t *testing.T) {
	hang := writeFile(t, "hang", []byte("#!/bin/sh\nexec sleep 60\n"), 0o755)
	logger, _ := testLogger(t)
	before := children(t)

	ctx, cancel := context.WithCancel(t.Context())
	result := make(chan error, 1)
	go func() {
		inst, err := catalog.Launch(ctx, hang, "", catalog.Options{Logger: logger, StartTimeout: time.Minute})
		if err == nil {
			inst.Kill()
		}
		result <- err
	}()
	// Cancel once the hanging process has been started, so that the
	// handshake is what gets cancelled.
	waitFor(t, 10*time.Second, "the plugin process to start", func() bool { return len(children(t)) > len(before) })
	cancel()
	start := time.Now()
	select {
	case err := <-result:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Launch(cancelled ctx) = %v, want errors.Is context.Canceled", err)
		}
		// The start timeout is a minute; well under it means ctx ended it.
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("Launch returned %v after cancel, want promptly", d)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Launch did not return within 30s of its context being cancelled")
	}
	noNewChildren(t, before)
}

func TestConfigure(t *testing.T) {
	tests := []struct {
		name     string
		config   string
		wantAttr string // "" with wantErr false: success
		wantErr  bool
		wantMsg  string // the whole message, if given
	}{
		{name: "valid", config: `{"greeting":"hi"}`},
		{name: "empty greeting", config: `{"greeting":""}`, wantAttr: "greeting", wantErr: true,
			wantMsg: "plugin rejected config: greeting: must not be empty"},
		{name: "unknown field", config: `{"colour":"blue"}`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inst := launch(t, "hello", catalog.Options{})
			err := inst.Configure(t.Context(), "hello", []byte(tt.config), t.TempDir(), &pluginv1.Limits{MaxBodyBytes: 1024})
			if !tt.wantErr {
				if err != nil {
					t.Fatalf("Configure(%s) = %v, want nil", tt.config, err)
				}
				return
			}
			var ce *sdk.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("Configure(%s) = %v (%T), want an *sdk.ConfigError", tt.config, err, err)
			}
			if ce.Attribute != tt.wantAttr {
				t.Errorf("Configure(%s) Attribute = %q, want %q", tt.config, ce.Attribute, tt.wantAttr)
			}
			if ce.Message == "" || !strings.HasPrefix(err.Error(), "plugin rejected config: ") {
				t.Errorf("Configure(%s) = %q, want a message under %q", tt.config, err, "plugin rejected config")
			}
			if tt.wantMsg != "" && err.Error() != tt.wantMsg {
				t.Errorf("Configure(%s) = %q, want %q", tt.config, err, tt.wantMsg)
			}
		})
	}

	t.Run("twice", func(t *testing.T) {
		inst := launch(t, "hello", catalog.Options{})
		cfg := []byte(`{"greeting":"hi"}`)
		if err := inst.Configure(t.Context(), "hello", cfg, t.TempDir(), nil); err != nil {
			t.Fatalf("first Configure() = %v, want nil", err)
		}
		err := inst.Configure(t.Context(), "hello", cfg, t.TempDir(), nil)
		var ce *sdk.ConfigError
		if err == nil || errors.As(err, &ce) {
			t.Errorf("second Configure() = %v, want a transport error that is not an *sdk.ConfigError", err)
		}
	})
}

func TestEnvironmentAllowlist(t *testing.T) {
	t.Setenv("PLUGHOST_TEST_SECRET", "hunter2")
	t.Setenv("PLUGHOST_TEST_ALLOWED", "yes")

	// goPlugin lists what go-plugin itself sets for the handshake, and
	// the host for the data plane and the log limit.
	goPlugin := []string{"PLUGHOST_PLUGIN", "PLUGIN_MIN_PORT", "PLUGIN_MAX_PORT", "PLUGIN_PROTOCOL_VERSIONS", "PLUGIN_CLIENT_CERT", "PLUGIN_MULTIPLEX_GRPC", wire.DataPlaneEnv, wire.LogRateEnv, wire.LogBurstEnv}

	tests := []struct {
		name    string
		env     []string          // Options.Env
		extra   map[string]string // Options.ExtraEnv
		limit   catalog.LogLimit  // Options.LogLimit
		allowed []string          // names the plugin may see besides goPlugin
		want    []string          // NAME=value pairs the plugin must see
		absent  []string          // NAME=value pairs it must not see
	}{
		{
			name:    "default allowlist",
			env:     nil,
			allowed: catalog.DefaultEnv,
			want:    []string{"PATH=" + os.Getenv("PATH")},
			// No limit, and so no limit passed on.
			absent: []string{wire.LogRateEnv + "=0"},
		},
		{
			name:    "custom allowlist",
			env:     []string{"PLUGHOST_TEST_ALLOWED", "PLUGHOST_TEST_UNSET"},
			allowed: []string{"PLUGHOST_TEST_ALLOWED"},
			want:    []string{"PLUGHOST_TEST_ALLOWED=yes"},
		},
		{
			// The operator's env block: added to what the allowlist passes
			// on, and replacing an allowed variable of the same name.
			name:    "env block",
			env:     []string{"PLUGHOST_TEST_ALLOWED"},
			extra:   map[string]string{"GOGC": "800", "PLUGHOST_TEST_ALLOWED": "from the block"},
			allowed: []string{"PLUGHOST_TEST_ALLOWED", "GOGC"},
			want:    []string{"GOGC=800", "PLUGHOST_TEST_ALLOWED=from the block"},
			absent:  []string{"PLUGHOST_TEST_ALLOWED=yes"},
		},
		{
			// The log limit, which the SDK applies too.
			name:    "log limit",
			limit:   catalog.LogLimit{Rate: 7000, Burst: 9000},
			allowed: catalog.DefaultEnv,
			want:    []string{wire.LogRateEnv + "=7000", wire.LogBurstEnv + "=9000"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logger, logs := testLogger(t)
			inst := launch(t, "envdump", catalog.Options{Logger: logger, Env: tt.env, ExtraEnv: tt.extra, LogLimit: tt.limit})

			code, body, err := get(t.Context(), inst.Transport(), "/env")
			if err != nil || code != 200 {
				t.Fatalf("GET /env = %d %s, %v, want 200", code, body, err)
			}
			var env []string
			if err := json.Unmarshal([]byte(body), &env); err != nil {
				t.Fatalf("decode /env: %v", err)
			}
			for _, kv := range env {
				name, _, _ := strings.Cut(kv, "=")
				if !slices.Contains(tt.allowed, name) && !slices.Contains(goPlugin, name) {
					t.Errorf("plugin environment holds %s, which is not allowlisted", name)
				}
				if strings.Contains(kv, "hunter2") {
					t.Errorf("plugin environment holds the host's secret: %s", name)
				}
			}
			for _, w := range tt.want {
				if !slices.Contains(env, w) {
					t.Errorf("plugin environment = %q, want it to hold %q", env, w)
				}
			}
			for _, a := range tt.absent {
				if slices.Contains(env, a) {
					t.Errorf("plugin environment = %q, want it without %q", env, a)
				}
			}

			// What the plugin prints to stdout reaches the logger, line by
			// line, marked as stdout.
			if err := inst.Configure(t.Context(), "envdump", nil, t.TempDir(), nil); err != nil {
				t.Fatalf("Configure() = %v, want nil", err)
			}
			waitFor(t, 10*time.Second, "the plugin's stdout in the log", func() bool {
				return strings.Contains(logs.String(), "envdump: done")
			})
			out := logs.String()
			if !strings.Contains(out, "stream=stdout") || !strings.Contains(out, "envdump: name PLUGHOST_PLUGIN") {
				t.Errorf("log = %s, want stdout lines naming PLUGHOST_PLUGIN", out)
			}
			if strings.Contains(out, "PLUGHOST_TEST_SECRET") {
				t.Errorf("log names PLUGHOST_TEST_SECRET; the plugin saw it:\n%s", out)
			}
		})
	}
}

// get sends GET path over tr and returns the status and the whole body.
func get(ctx context.Context, tr dataplane.Transport, path string) (int, string, error) {
	resp, err := tr.RoundTrip(ctx, &dataplane.Request{Method: http.MethodGet, Path: path})
	if err != nil {
		return 0, "", err
	}
	defer resp.Close()
	var body []byte
	for {
		piece, err := resp.Next()
		if err == io.EOF {
			return resp.Status, string(body), nil
		}
		if err != nil {
			return resp.Status, string(body), err
		}
		body = append(body, piece...)
	}
}
