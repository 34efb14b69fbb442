package main

import (
	"net/http"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
)

// TestWalletTimeouts: a batch call that outlasts settle.timeout counts in
// rewarder_wallet_timeouts_total{op="batch"}, not under the account
// call's op nor in the committer's io_timeouts_total; the retry settles
// once.
func TestWalletTimeouts(t *testing.T) {
	const funds, pool, n = 1 << 40, 5000, 10
	w := newWalletStub("pool", funds)
	w.before = func(n int, _ *http.Request) int {
		if n != 0 {
			return 0
		}
		// The first batch answers well past the rewarder's deadline of
		// 100 ms (the request's own context ends a little before it).
		time.Sleep(500 * time.Millisecond)
		return http.StatusServiceUnavailable
	}
	h := plugintest.New(t, definition(), plugintest.Options{Config: `rescan = "50ms"
settle {
  backoff = "1ms"
  timeout = "100ms"
}`, Plugins: map[string]http.Handler{"wallet": w}})
	call(t, h, "POST", "/v1/epochs/t1/compute", inputs(pool, n))
	waitState(t, h, "t1", stateSettled)
	checkPaidOnce(t, w, funds, pool, n)
	for series, want := range map[string]string{
		`rewarder_wallet_timeouts_total{op="batch"}`:   "1",
		`rewarder_wallet_timeouts_total{op="account"}`: "0",
		`io_timeouts_total{op="wallet_call"}`:          "",
	} {
		if got := metric(t, h, series); got != want {
			t.Errorf("%s = %q, want %q", series, got, want)
		}
	}
	if _, _, err := h.Drain(t.Context(), time.Now().Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
}
