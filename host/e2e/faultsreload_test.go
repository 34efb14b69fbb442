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

// TestFaultsAtUnknownPoint: a fault at a point the plugin does not
// declare is refused with 400 and the plugin's points, and the whole list
// with it, so that a misspelt point cannot pass for a rehearsal. A plugin
// that declares none says so, and its faults can still be cleared.
func TestFaultsAtUnknownPoint(t *testing.T) {
	h := startHost(t, baseConfig("2s")+faultsOn+walletBlock("")+pluginBlock("hello", "hello", ""))
	readyPlugin(t, h, "wallet")
	readyPlugin(t, h, "hello")
	post := func(plugin, body string) (int, string) {
		t.Helper()
		return do(t, http.MethodPost, h.admin+"/v1/plugins/"+plugin+"/faults", strings.NewReader(body), nil)
	}
	issue := func(key string) int {
		t.Helper()
		return mustPost(t, h, "/wallet/v1/issue", key, `{"to":"acct-1","amount":1}`).code
	}

	code, body := post("wallet", `{"faults":[{"point":"ledger.comit","error":"EIO"}]}`)
	if code != http.StatusBadRequest || errorCode(body) != "unknown_fault_point" ||
		!strings.Contains(body, `unknown fault point \"ledger.comit\": this plugin's fault points are \"ledger.commit\", \"ledger.sync\"`) {
		t.Fatalf("POST a fault at ledger.comit = %d %s, want 400 unknown_fault_point naming ledger.commit and ledger.sync", code, body)
	}
	if got := issue("unknown-point-1"); got != http.StatusOK {
		t.Fatalf("POST /wallet/v1/issue after the refused fault = %d, want 200: no fault is set", got)
	}

	setFaults(t, h, "wallet", `{"faults":[{"point":"ledger.commit","error":"EIO"}]}`)
	if got := issue("unknown-point-2"); got != http.StatusServiceUnavailable {
		t.Fatalf("POST /wallet/v1/issue with the commit failing = %d, want 503", got)
	}
	// A list with one unknown point is refused whole: the EIO stays.
	code, body = post("wallet", `{"faults":[{"point":"ledger.sync","delay":"1ms"},{"point":"nope","error":"x"}]}`)
	if code != http.StatusBadRequest || errorCode(body) != "unknown_fault_point" {
		t.Fatalf("POST a list with an unknown point = %d %s, want 400 unknown_fault_point", code, body)
	}
	if got := issue("unknown-point-3"); got != http.StatusServiceUnavailable {
		t.Fatalf("POST /wallet/v1/issue after the refused list = %d, want 503: the EIO set before stays", got)
	}
	setFaults(t, h, "wallet", "")

	code, body = post("hello", `{"faults":[{"point":"hello.greet","delay":"1s"}]}`)
	if code != http.StatusBadRequest || errorCode(body) != "unknown_fault_point" || !strings.Contains(body, "declares no fault points") {
		t.Fatalf("POST a fault to hello = %d %s, want 400 unknown_fault_point: it declares no fault points", code, body)
	}
	setFaults(t, h, "hello", "")
}
