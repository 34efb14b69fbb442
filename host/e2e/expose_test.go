package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/host/catalog"
)

// TestReadyzShowsNoDetails: /readyz needs no token, so with an admin token
// set it still says only whether each plugin serves; pids, versions,
// binary paths, checksums and errors are for the admin API.
func TestReadyzShowsNoDetails(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "admin.token")
	const token = "s3cret-admin-token"
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sum, err := catalog.FileSHA256(filepath.Join(bins.plugins, "hello"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(baseConfig("2s"), "admin {\n", "admin {\n  token_file = \""+tokenFile+"\"\n", 1)
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
