package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// readiness returns GET /readyz/NAME's status and state, and fails the
// test unless its body is exactly the name and the state.
func (h *hostProc) readiness(name string) (int, string) {
	h.t.Helper()
	code, body := h.get(h.ingress + "/readyz/" + name)
	var raw map[string]any
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		h.t.Fatalf("GET /readyz/%s body %q: %v", name, body, err)
	}
	if len(raw) != 2 || raw["name"] != name {
		h.t.Fatalf("GET /readyz/%s = %s, want only its name and state", name, body)
	}
	state, _ := raw["state"].(string)
	return code, state
}

// waitReadiness waits until GET /readyz/NAME answers code with state.
func (h *hostProc) waitReadiness(name string, code int, state string) {
	h.t.Helper()
	waitFor(h.t, 30*time.Second, "/readyz/"+name+" to be "+state, func() bool {
		c, s := h.readiness(name)
		return c == code && s == state
	})
}

// TestReadyzPerPlugin checks GET /readyz/NAME through a plugin's health
// changes, and that unready_when_degraded makes a degraded required
// plugin turn the aggregate /readyz 503.
func TestReadyzPerPlugin(t *testing.T) {
	data := t.TempDir()
	if err := os.MkdirAll(filepath.Join(data, "frail"), 0o750); err != nil {
		t.Fatal(err)
	}
	health := filepath.Join(data, "frail", "health")
	setHealth := func(s string) {
		t.Helper()
		if s == "" {
			if err := os.Remove(health); err != nil {
				t.Fatal(err)
			}
			return
		}
		if err := os.WriteFile(health, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	base := withDataDir(t, baseConfig("5s"), data) + helloWith("hi")
	h := startHost(t, base+pluginBlock("frail", "frail", ""))
	// waitHealthMetric waits until plughost_plugin_health{plugin="frail"}
	// is 1 for want alone, as alerts and the dashboard read the health.
	waitHealthMetric := func(want string) {
		t.Helper()
		var got map[string]float64
		waitFor(t, 30*time.Second, "plughost_plugin_health of frail to be "+want, func() bool {
			_, body := h.get(h.admin + "/metrics")
			got = map[string]float64{}
			for _, s := range []string{"ready", "degraded", "not_ready"} {
				v, ok := parseMetric(body, `plughost_plugin_health{plugin="frail",status="`+s+`"}`)
				if !ok {
					return false
				}
				got[s] = v
			}
			for s, v := range got {
				if v != 0 && s != want || v != 1 && s == want {
					return false
				}
			}
			return true
		})
	}

	h.waitReadiness("frail", http.StatusOK, "ready")
	waitHealthMetric("ready")
	if code, state := h.readiness("hello"); code != http.StatusOK || state != "ready" {
		t.Errorf("GET /readyz/hello = %d %s, want 200 ready", code, state)
	}
	if code, body := h.get(h.ingress + "/readyz/nothing"); code != http.StatusNotFound {
		t.Errorf("GET /readyz/nothing = %d %s, want 404", code, body)
	}

	// Degraded: its own readiness is 503; by default the aggregate stays
	// 200, and the plugin still serves.
	setHealth("degraded")
	h.waitReadiness("frail", http.StatusServiceUnavailable, "degraded")
	waitHealthMetric("degraded")
	if code, body := h.get(h.ingress + "/readyz"); code != http.StatusOK {
		t.Errorf("GET /readyz with frail degraded = %d %s, want 200 without unready_when_degraded", code, body)
	}
	if code, body := h.get(h.ingress + "/frail/"); code != http.StatusOK {
		t.Errorf("GET /frail/ while degraded = %d %s, want 200", code, body)
	}

	// Not ready: 503, and so is the aggregate (frail is required).
	setHealth("not_ready")
	h.waitReadiness("frail", http.StatusServiceUnavailable, "not_ready")
	waitHealthMetric("not_ready")
	if code, body := h.get(h.ingress + "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("GET /readyz with frail not ready = %d %s, want 503", code, body)
	}

	// With unready_when_degraded, a degraded frail turns /readyz 503.
	setHealth("degraded")
	h.reload(base+pluginBlock("frail", "frail", "  unready_when_degraded = true"), "config reloaded")
	h.waitReadiness("frail", http.StatusServiceUnavailable, "degraded")
	waitFor(t, 30*time.Second, "/readyz to be 503 with frail degraded", func() bool {
		code, _ := h.get(h.ingress + "/readyz")
		return code == http.StatusServiceUnavailable
	})
	setHealth("")
	h.waitReadiness("frail", http.StatusOK, "ready")
	waitHealthMetric("ready")
	if code, body := h.get(h.ingress + "/readyz"); code != http.StatusOK {
		t.Errorf("GET /readyz with frail ready again = %d %s, want 200", code, body)
	}
}

// TestReadyzDuringSingleInstanceReplace polls /readyz and /readyz/wallet
// while a reload replaces the wallet, a single-instance plugin whose
// requests the host holds meanwhile: both stay 200 throughout, and
// /readyz/wallet shows the replacement.
func TestReadyzDuringSingleInstanceReplace(t *testing.T) {
	dir := copyPlugins(t, "hello", "wallet")
	h := startHost(t, zeroDowntimeConfig(dir, "one", "24h"))
	before := readyPlugin(t, h, "wallet")
	h.waitReadiness("wallet", http.StatusOK, "ready")

	type poll struct {
		path  string
		code  int
		state string
	}
	var (
		bad      []poll
		replaced bool
		polls    int
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, path := range []string{"/readyz", "/readyz/wallet"} {
				resp, err := client.Get(h.ingress + path)
				if err != nil {
					bad = append(bad, poll{path: path, state: err.Error()})
					continue
				}
				var body struct {
					State string `json:"state"`
				}
				_ = json.NewDecoder(resp.Body).Decode(&body)
				resp.Body.Close()
				polls++
				if resp.StatusCode != http.StatusOK {
					bad = append(bad, poll{path, resp.StatusCode, body.State})
				}
				if body.State == "replacing" {
					replaced = true
				}
			}
		}
	}()
	h.reload(zeroDowntimeConfig(dir, "one", "12h"), "config reloaded")
	close(stop)
	<-done

	if after := h.plugins()["wallet"]; after.Pid == before.Pid || after.State != "ready" {
		t.Fatalf("wallet after a reload that changed its config = %+v, want a new ready process", after)
	}
	if len(bad) > 0 {
		t.Errorf("%d of %d readiness polls during the wallet's replacement were not 200, first %+v", len(bad), polls, bad[0])
	}
	if !replaced {
		t.Errorf("no poll of %d saw /readyz/wallet in state replacing: the test did not watch the replacement", polls)
	}
}

// TestNotReadyIsNotReady checks the 503 a request gets while a plugin the
// supervisor holds ready reports itself not ready: it says so, never that
// the plugin "is ready", and the admin API shows the plugin's reason.
func TestNotReadyIsNotReady(t *testing.T) {
	data := t.TempDir()
	if err := os.MkdirAll(filepath.Join(data, "frail"), 0o750); err != nil {
		t.Fatal(err)
	}
	h := startHost(t, withDataDir(t, baseConfig("5s"), data)+pluginBlock("frail", "frail", ""))
	h.waitReadiness("frail", http.StatusOK, "ready")
	if err := os.WriteFile(filepath.Join(data, "frail", "health"), []byte("not_ready"), 0o600); err != nil {
		t.Fatal(err)
	}
	h.waitReadiness("frail", http.StatusServiceUnavailable, "not_ready")

	code, body := h.get(h.ingress + "/frail/")
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("GET /frail/ body %q: %v", body, err)
	}
	want := `plugin "frail" reports itself not ready; it is sent no requests until it is`
	if code != http.StatusServiceUnavailable || e.Error.Code != "plugin_unavailable" || e.Error.Message != want {
		t.Errorf("GET /frail/ while not ready = %d %s, want 503 plugin_unavailable %q", code, body, want)
	}
	_, list := h.get(h.admin + "/v1/plugins")
	if !strings.Contains(list, `"health_reason":"told to be not ready"`) {
		t.Errorf("GET /v1/plugins = %s, want frail's health_reason", list)
	}
}
