package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// noSpace is what frail's Configure fails with while its refuse file is
// there, as a store that cannot open on a full disk.
const noSpace = "write wallet.db.wal.1: no space left on device"

// TestConfigureFailureContained starts the host with frail, required,
// whose Configure fails: the host serves, hello answers, frail is listed
// restarting with its reason, its mount answers 503 plugin_unavailable
// and /readyz 503; once the cause is gone frail comes up by itself. An
// operator's restart while Configure fails again keeps frail listed and
// routed, and it comes back once the cause is gone; so does a plugin a
// reload adds.
func TestConfigureFailureContained(t *testing.T) {
	data := t.TempDir()
	if err := os.MkdirAll(filepath.Join(data, "frail"), 0o750); err != nil {
		t.Fatal(err)
	}
	refuse := filepath.Join(data, "frail", "refuse")
	if err := os.WriteFile(refuse, []byte(noSpace), 0o600); err != nil {
		t.Fatal(err)
	}
	base := withDataDir(t, baseConfig("5s"), data)
	// Enough restarts that the budget outlasts the test's wait.
	const budget = `max_restarts    = 5`
	if !strings.Contains(base, budget) {
		t.Fatalf("base config has no %s", budget)
	}
	base = strings.Replace(base, budget, `max_restarts    = 1000`, 1)
	cfg := base + pluginBlock("frail", "frail", "  required = true") + helloWith("hi")
	h := startHost(t, cfg)

	// down checks what the host shows while frail's Configure fails.
	down := func(when string, restartsAbove int) {
		t.Helper()
		var st pluginStatus
		waitFor(t, 30*time.Second, "frail to be retried "+when, func() bool {
			st = h.plugins()["frail"]
			return st.Restarts > restartsAbove+1 && strings.Contains(st.LastError, noSpace)
		})
		if st.State == "ready" || st.State == "failed" {
			t.Errorf("frail %s = %s, last_error %q; want it restarting", when, st.State, st.LastError)
		}
		if code, body := h.get(h.ingress + "/frail/"); code != http.StatusServiceUnavailable || !strings.Contains(body, "plugin_unavailable") {
			t.Errorf("GET /frail/ %s = %d %s, want 503 plugin_unavailable", when, code, body)
		}
		if code, body := h.get(h.ingress + "/readyz"); code != http.StatusServiceUnavailable {
			t.Errorf("GET /readyz %s = %d %s, want 503: frail is required", when, code, body)
		}
		if code, body := h.greeting(); code != http.StatusOK {
			t.Errorf("GET /hello/ %s = %d %s, want 200: the other plugins serve", when, code, body)
		}
	}
	up := func(when string) {
		t.Helper()
		if err := os.Remove(refuse); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "frail to come up "+when, func() bool {
			code, _ := h.get(h.ingress + "/frail/")
			return code == http.StatusOK
		})
		if code, body := h.get(h.ingress + "/readyz"); code != http.StatusOK {
			t.Errorf("GET /readyz once frail is up %s = %d %s, want 200", when, code, body)
		}
	}

	down("at start", 0)
	up("after the start")

	if err := os.WriteFile(refuse, []byte(noSpace), 0o600); err != nil {
		t.Fatal(err)
	}
	restarts := h.plugins()["frail"].Restarts
	if code, body := do(t, http.MethodPost, h.admin+"/v1/plugins/frail/restart", nil, nil); code != http.StatusAccepted {
		t.Fatalf("POST restart = %d %s, want 202", code, body)
	}
	down("after an operator's restart", restarts)
	up("after the operator's restart")

	// A plugin a reload adds, whose Configure fails, is started and
	// retried the same way; the reload goes ahead.
	if err := os.MkdirAll(filepath.Join(data, "frail2"), 0o750); err != nil {
		t.Fatal(err)
	}
	refuse2 := filepath.Join(data, "frail2", "refuse")
	if err := os.WriteFile(refuse2, []byte(noSpace), 0o600); err != nil {
		t.Fatal(err)
	}
	h.reload(cfg+pluginBlock("frail2", "frail", ""), "config reloaded")
	var st pluginStatus
	waitFor(t, 30*time.Second, "frail2 to be retried after the reload", func() bool {
		st = h.plugins()["frail2"]
		return st.Restarts > 1 && strings.Contains(st.LastError, noSpace)
	})
	if code, body := h.get(h.ingress + "/frail2/"); code != http.StatusServiceUnavailable || !strings.Contains(body, "plugin_unavailable") {
		t.Errorf("GET /frail2/ while its Configure fails = %d %s, want 503 plugin_unavailable", code, body)
	}
	if err := os.Remove(refuse2); err != nil {
		t.Fatal(err)
	}
	readyPlugin(t, h, "frail2")
	if code, body := h.get(h.ingress + "/frail2/"); code != http.StatusOK {
		t.Errorf("GET /frail2/ once its cause is gone = %d %s, want 200", code, body)
	}
}
