package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestReloadAppliesDebugFaults: a SIGHUP applies debug.faults at once.
// Turned on, the admin API sets faults; turned off, it refuses them again
// and the faults already set are cleared, so that the wallet writes again.
func TestReloadAppliesDebugFaults(t *testing.T) {
	wallet := walletBlock(`    breaker {
      failures  = 1
      cool_down = "1s"
    }`)
	off, on := baseConfig("2s")+wallet, baseConfig("2s")+faultsOn+wallet
	const eio = `{"faults":[{"point":"ledger.commit","error":"EIO"}]}`
	post := func(h *hostProc) (int, string) {
		return do(t, http.MethodPost, h.admin+"/v1/plugins/wallet/faults", strings.NewReader(eio), nil)
	}

	h := startHost(t, off)
	readyPlugin(t, h, "wallet")
	if code, body := post(h); code != http.StatusForbidden || !strings.Contains(body, "faults_disabled") {
		t.Fatalf("POST faults with debug.faults off = %d %s, want 403 faults_disabled", code, body)
	}

	h.reload(on, "config reloaded")
	if strings.Contains(h.log.String(), "do not change on reload") {
		t.Errorf("the reload warns that a setting needs a restart:\n%s", h.log.String())
	}
	setFaults(t, h, "wallet", eio)
	if r := mustPost(t, h, "/wallet/v1/issue", "faults-reload-1", `{"to":"acct-1","amount":1}`); r.code != http.StatusServiceUnavailable {
		t.Fatalf("POST /wallet/v1/issue with the commit failing = %v, want 503", r)
	}

	h.reload(off, "fault injection turned off; faults cleared")
	if code, body := post(h); code != http.StatusForbidden {
		t.Errorf("POST faults after the reload turned them off = %d %s, want 403", code, body)
	}
	waitFor(t, 15*time.Second, "the wallet to write again with its fault cleared", func() bool {
		return mustPost(t, h, "/wallet/v1/issue", "faults-reload-2", `{"to":"acct-1","amount":1}`).code == http.StatusOK
	})
}
