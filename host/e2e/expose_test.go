package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plughost/plughost/host/catalog"
)

// TestReadyzShowsNoDetails: /readyz needs no token, so with an admin token
// set it still says only whether each plugin serves; pids, versions,
// binary paths, checksums and errors are for the admin API.
func TestReadyzShowsNoDetails(t *testing.T) {
	const token = "s3cret-admin-token"
	cfg, _ := tokenConfig(t, "2s", token)
	sum, err := catalog.FileSHA256(filepath.Join(bins.plugins, "hello"))
	if err != nil {
		t.Fatal(err)
	}
	h := startHost(t, cfg+
		pluginBlock("hello", "hello", "  sha256 = \""+sum+"\"")+
		pluginBlock("broken", "crasher", "  required = false"))
	auth := http.Header{"Authorization": {"Bearer " + token}}

	var detail map[string]pluginStatus
	waitFor(t, 15*time.Second, "hello ready and broken's last_error set", func() bool {
		detail = adminPlugins(t, h, auth)
		return detail["hello"].State == "ready" && detail["broken"].LastError != ""
	})
	if resp, body := mustRequest(t, http.MethodGet, h.admin+"/v1/plugins", nil, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /v1/plugins without the token = %d %s, want 401", resp.StatusCode, body)
	}

	resp, body := mustRequest(t, http.MethodGet, h.ingress+"/readyz", nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /readyz = %d %s, want 200 (broken is optional)", resp.StatusCode, body)
	}
	var rz struct {
		Ready   bool             `json:"ready"`
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(body, &rz); err != nil {
		t.Fatalf("decode /readyz: %v: %s", err, body)
	}
	got := map[string]string{}
	for _, p := range rz.Plugins {
		name, _ := p["name"].(string)
		for k := range p {
			if !map[string]bool{"name": true, "state": true, "health": true, "ready": true}[k] {
				t.Errorf("/readyz plugin %q has %q, want only name, state, health and ready", name, k)
			}
		}
		state, _ := p["state"].(string)
		got[name] = state
		if ready, _ := p["ready"].(bool); ready != (name == "hello") {
			t.Errorf("/readyz plugin %q ready = %v, want %t", name, p["ready"], name == "hello")
		}
	}
	if got["hello"] != "ready" || got["broken"] == "" || got["broken"] == "ready" {
		t.Errorf("/readyz states = %v, want hello ready and broken not ready", got)
	}
	for what, secret := range map[string]string{
		"a binary path":       bins.dir,
		"hello's sha256":      sum,
		"hello's version":     detail["hello"].Version,
		"broken's last_error": detail["broken"].LastError,
	} {
		if secret != "" && strings.Contains(string(body), secret) {
			t.Errorf("/readyz shows %s (%q): %s", what, secret, body)
		}
	}
}

// tmpEntries lists dir's entries as name, or name/ followed by what a
// directory holds.
func tmpEntries(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if d.IsDir() {
			rel += "/"
		}
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestStaleSocketsCleaned: a host killed with SIGKILL cannot remove its
// plugins' go-plugin sockets. They are all in its own directory in TMPDIR,
// which the next host removes when it starts, saying so when the dead host
// was its own earlier run (the same data_dir) and only removing it
// otherwise, and a host that stops normally leaves nothing.
func TestStaleSocketsCleaned(t *testing.T) {
	tmp := t.TempDir() // before Setenv: the test's other temp dirs stay outside
	t.Setenv("TMPDIR", tmp)
	withData := func(dir string) string {
		return strings.Replace(baseConfig("2s"), `data_dir       = "./data"`, fmt.Sprintf("data_dir = %q", dir), 1) +
			helloWith("through the broker") + pluginBlock("caller", "caller", "")
	}
	cfg, otherCfg := withData(t.TempDir()), withData(t.TempDir())
	const said = "removed plugin sockets a killed host left behind"

	// killed starts a host on cfg, kills it with SIGKILL and returns the
	// directory it leaves behind in TMPDIR.
	killed := func(cfg string) string {
		t.Helper()
		a := startHost(t, cfg)
		readyPlugin(t, a, "hello")
		readyPlugin(t, a, "caller")
		// The Host service carries this call: its broker connection too.
		if code, body := a.get(a.ingress + "/caller/call"); code != http.StatusOK {
			t.Fatalf("GET /caller/call = %d %s, want 200", code, body)
		}
		pids := a.pluginPidsFromLog()
		a.signal(syscall.SIGKILL)
		if _, exited := a.waitExit(10 * time.Second); !exited {
			t.Fatal("host still running 10s after SIGKILL")
		}
		for _, pid := range pids {
			if !waitGone(pid, 10*time.Second) {
				t.Fatalf("plugin %d still running 10s after its host was killed", pid)
			}
		}
		left := tmpEntries(t, tmp)
		t.Logf("TMPDIR after kill -9 of the host: %q", left)
		var stale string
		for _, e := range left {
			if !strings.HasPrefix(e, "plughost-sockets-") {
				t.Errorf("TMPDIR holds %q after kill -9 of the host, want everything in its plughost-sockets-* directory", e)
			} else if strings.HasSuffix(e, "/") {
				stale = strings.TrimSuffix(e, "/")
			}
		}
		if stale == "" {
			t.Fatalf("TMPDIR after kill -9 = %q, want the killed host's plughost-sockets-* directory", left)
		}
		return stale
	}

	stale := killed(cfg)
	b := startHost(t, otherCfg)
	readyPlugin(t, b, "hello")
	if _, err := os.Stat(filepath.Join(tmp, stale)); !os.IsNotExist(err) {
		t.Errorf("%s after another host started: %v, want it removed", stale, err)
	}
	if log := b.log.String(); strings.Contains(log, said) || !strings.Contains(log, "removed socket directories other dead plughost processes left behind") {
		t.Errorf("another host's log says %q, or does not say at debug that it removed %s", said, stale)
	}
	b.signal(syscall.SIGTERM)
	if code, exited := b.waitExit(10 * time.Second); !exited || code != 0 {
		t.Fatalf("host after SIGTERM: exited %t, code %d; want 0 within 10s", exited, code)
	}

	stale = killed(cfg)
	b = startHost(t, cfg)
	readyPlugin(t, b, "hello")
	if _, err := os.Stat(filepath.Join(tmp, stale)); !os.IsNotExist(err) {
		t.Errorf("%s after the next host started: %v, want it removed", stale, err)
	}
	if !strings.Contains(b.log.String(), said+": sockets=") {
		t.Errorf("the next host's log does not say it removed %s", stale)
	}
	b.signal(syscall.SIGTERM)
	if code, exited := b.waitExit(10 * time.Second); !exited || code != 0 {
		t.Fatalf("host after SIGTERM: exited %t, code %d; want 0 within 10s", exited, code)
	}
	if left := tmpEntries(t, tmp); len(left) != 0 {
		t.Errorf("TMPDIR after the host stopped = %q, want it empty", left)
	}
}

// TestProbeSocketsInHostDir: the plugins launched only as far as Describe
// (by validate, by plugin info, and by a reload to check a changed
// plugin's config; for the wallet, single-instance, once more before its
// old process is drained) make their go-plugin sockets in a directory
// that is removed, never loose in TMPDIR where nobody removes them.
func TestProbeSocketsInHostDir(t *testing.T) {
	tmp := t.TempDir() // before Setenv: the test's other temp dirs stay outside
	t.Setenv("TMPDIR", tmp)
	cfg := baseConfig("2s") + helloWith("one") + walletBlock(`    idempotency_ttl = "24h"`)
	path := writeConfigFile(t, cfg)

	if res := runCLI(t, "validate", "-config", path); res.code != 0 {
		t.Fatalf("plughost validate = exit %d, want 0\n%s", res.code, res.stderr)
	}
	if left := tmpEntries(t, tmp); len(left) != 0 {
		t.Errorf("TMPDIR after plughost validate = %q, want it empty", left)
	}
	if res := runCLI(t, "plugin", "info", filepath.Join(bins.plugins, "hello")); res.code != 0 {
		t.Fatalf("plughost plugin info = exit %d, want 0\n%s", res.code, res.stderr)
	}
	if left := tmpEntries(t, tmp); len(left) != 0 {
		t.Errorf("TMPDIR after plughost plugin info = %q, want it empty", left)
	}

	h := startHost(t, cfg)
	readyPlugin(t, h, "hello")
	before := readyPlugin(t, h, "wallet")
	h.reload(baseConfig("2s")+helloWith("two")+walletBlock(`    idempotency_ttl = "12h"`), "config reloaded")
	if st := h.plugins()["wallet"]; st.Pid == before.Pid {
		t.Fatalf("wallet after a reload that changed its config = %+v, want a new process", st)
	}
	for _, e := range tmpEntries(t, tmp) {
		if !strings.HasPrefix(e, "plughost-sockets-") {
			t.Errorf("TMPDIR holds %q after a reload, want everything in the host's plughost-sockets-* directory", e)
		}
	}
	h.signal(syscall.SIGTERM)
	if code, exited := h.waitExit(10 * time.Second); !exited || code != 0 {
		t.Fatalf("host after SIGTERM: exited %t, code %d; want 0 within 10s", exited, code)
	}
	if left := tmpEntries(t, tmp); len(left) != 0 {
		t.Errorf("TMPDIR after the host stopped = %q, want it empty", left)
	}
}
