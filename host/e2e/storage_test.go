package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// corruptDetail is what frail reports after sdk.ErrStorageCorrupt.
const corruptDetail = "wallet.db.wal.1 record 17 at offset 20: checksum mismatch; restore from backup or run `wallet check -repair`"

// withDataDir returns cfg (from baseConfig) with its data_dir at dir.
func withDataDir(t *testing.T, cfg, dir string) string {
	t.Helper()
	const rel = `data_dir       = "./data"`
	if !strings.Contains(cfg, rel) {
		t.Fatalf("base config has no %s", rel)
	}
	return strings.Replace(cfg, rel, fmt.Sprintf("data_dir = %q", dir), 1)
}

// TestStorageCorrupt runs frail on a data dir it reports corrupt: the host
// serves, with frail failed, its message as last_error, and no restart;
// a reload that leaves frail's block as it is leaves frail alone; once the
// data is repaired, an operator's restart brings it up.
func TestStorageCorrupt(t *testing.T) {
	data := t.TempDir()
	if err := os.MkdirAll(filepath.Join(data, "frail"), 0o750); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(data, "frail", "corrupt")
	if err := os.WriteFile(marker, []byte(corruptDetail), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := withDataDir(t, baseConfig("5s"), data) + pluginBlock("frail", "frail", "") + helloWith("hi")
	h := startHost(t, cfg)

	want := "storage corrupt: " + corruptDetail
	var st pluginStatus
	waitFor(t, 30*time.Second, "frail to be failed", func() bool {
		st = h.plugins()["frail"]
		return st.State == "failed"
	})
	if st.LastError != want || st.Restarts != 0 {
		t.Errorf("frail = %s, last_error %q, %d restarts; want failed, %q, 0", st.State, st.LastError, st.Restarts, want)
	}
	if code, body := h.get(h.ingress + "/frail/"); code != http.StatusServiceUnavailable {
		t.Errorf("GET /frail/ = %d %s, want 503", code, body)
	}
	if code, body := h.greeting(); code != http.StatusOK {
		t.Errorf("GET /hello/ = %d %s, want 200: the other plugins serve", code, body)
	}
	starts := strings.Count(h.log.String(), "plugin found its storage corrupt")

	// A reload that does not change frail's block does not start it.
	h.reload(cfg+"\n", "config reloaded")
	if got := strings.Count(h.log.String(), "plugin found its storage corrupt"); got != starts {
		t.Errorf("frail found its storage corrupt %d times after a reload, want %d: the reload started it", got, starts)
	}
	if st := h.plugins()["frail"]; st.State != "failed" || st.LastError != want || st.Restarts != 0 {
		t.Errorf("frail after a reload = %s, last_error %q, %d restarts; want failed, %q, 0", st.State, st.LastError, st.Restarts, want)
	}

	// An operator's restart with the data still corrupt: failed again,
	// with the plugin's message.
	if code, body := do(t, http.MethodPost, h.admin+"/v1/plugins/frail/restart", nil, nil); code != http.StatusAccepted {
		t.Fatalf("POST restart = %d %s, want 202", code, body)
	}
	waitFor(t, 30*time.Second, "frail to find its storage corrupt again", func() bool {
		return strings.Count(h.log.String(), "plugin found its storage corrupt") > starts
	})
	waitFor(t, 30*time.Second, "frail to be failed again", func() bool {
		st = h.plugins()["frail"]
		return st.State == "failed"
	})
	if st.LastError != want {
		t.Errorf("frail last_error after a restart = %q, want %q", st.LastError, want)
	}

	// A reload that changes frail's block tries it again, and shows it
	// failed with its own message, not a replacement's story.
	changed := withDataDir(t, baseConfig("5s"), data) + pluginBlock("frail", "frail", "  env {\n    FRAIL_TRY = \"2\"\n  }") + helloWith("hi")
	before := strings.Count(h.log.String(), "plugin found its storage corrupt")
	h.reload(changed, "plugins refused their new config")
	if got := strings.Count(h.log.String(), "plugin found its storage corrupt"); got <= before {
		t.Errorf("a reload that changed frail's block did not start it")
	}
	if st := h.plugins()["frail"]; st.State != "failed" || st.LastError != want {
		t.Errorf("frail after a reload that changed it = %s, last_error %q; want failed, %q", st.State, st.LastError, want)
	}

	// Repaired: the operator's restart brings it up.
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	if code, body := do(t, http.MethodPost, h.admin+"/v1/plugins/frail/restart", nil, nil); code != http.StatusAccepted {
		t.Fatalf("POST restart = %d %s, want 202", code, body)
	}
	waitFor(t, 30*time.Second, "frail to serve", func() bool {
		code, _ := h.get(h.ingress + "/frail/")
		return code == http.StatusOK
	})
}

// TestExitDuringStart runs frail set to panic in Configure: its
// last_error says it exited during start, with its exit status and its
// panic message.
func TestExitDuringStart(t *testing.T) {
	data := t.TempDir()
	if err := os.MkdirAll(filepath.Join(data, "frail"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "frail", "crash"), []byte("bucket page 7: unexpected flags"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(withDataDir(t, baseConfig("5s"), data), "max_restarts    = 5", "max_restarts    = 1", 1)
	h := startHost(t, cfg+pluginBlock("frail", "frail", ""))
	var st pluginStatus
	waitFor(t, 30*time.Second, "frail to be failed", func() bool {
		st = h.plugins()["frail"]
		return st.State == "failed"
	})
	if want := "plugin exited during start (exit status 2): panic: frail: bucket page 7: unexpected flags"; !strings.Contains(st.LastError, want) {
		t.Errorf("frail last_error = %q, want it to contain %q", st.LastError, want)
	}
}
