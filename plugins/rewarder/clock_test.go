package main

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
	"github.com/plughost/plughost/sdk"
)

// clock is a settable clock for the rewarder's now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestHealthRestartWindow: more than 5 restarts within a minute of the
// injected clock make the plugin not ready; once they are a minute old,
// it is ready again.
func TestHealthRestartWindow(t *testing.T) {
	c := &clock{t: time.Now()}
	rw := &rewarder{now: c.Now}
	h := plugintest.New(t, newDefinition(rw), plugintest.Options{Config: testConfig, Plugins: map[string]http.Handler{"wallet": newWalletStub("pool", 1)}})
	t.Cleanup(func() { _, _, _ = h.Drain(context.Background(), time.Now().Add(2*time.Second)) })
	health := func() sdk.HealthStatus {
		hl, err := h.Health(t.Context())
		must(t, err)
		return hl.Status
	}
	r := rw.run
	for i := range 6 {
		if got := health(); got != sdk.StatusReady {
			t.Fatalf("health after %d restarts = %v, want ready", i, got)
		}
		r.mu.Lock()
		r.restarts = append(r.restarts, c.Now())
		r.mu.Unlock()
		c.Add(10 * time.Second)
	}
	// Six restarts at -60s … -10s: the first is exactly a minute old.
	if got := health(); got != sdk.StatusReady {
		t.Fatalf("health with the first restart a minute old = %v, want ready (5 in the window)", got)
	}
	c.Add(-time.Second)
	if got := health(); got != sdk.StatusNotReady {
		t.Fatalf("health with 6 restarts in the last minute = %v, want not ready", got)
	}
	if got := metric(t, h, `readyz_degraded{cause="restarts"}`); got != "1" {
		t.Errorf("readyz_degraded = %q, want 1", got)
	}
	c.Add(time.Minute)
	if got := health(); got != sdk.StatusReady {
		t.Errorf("health a minute later = %v, want ready", got)
	}
}

// TestSettlementRoundDeadline: a settlement round ends by now +
// epoch_duration/2 on the injected clock; with the clock far enough
// behind the real one, the round is over before the first attempt, and
// the epoch is quarantined as settlement_unavailable with nothing paid.
// Retry, with the clock back, settles it.
func TestSettlementRoundDeadline(t *testing.T) {
	c := &clock{t: time.Now().Add(-time.Hour)}
	rw := &rewarder{now: c.Now}
	w := newWalletStub("pool", 1<<40)
	h := plugintest.New(t, newDefinition(rw), plugintest.Options{Config: testConfig + `epoch_duration = "1h"`, Plugins: map[string]http.Handler{"wallet": w}})
	call(t, h, "POST", "/v1/epochs/t1/compute", inputs(1000, 5))
	e := waitState(t, h, "t1", stateQuarantined)
	if _, _, b := w.snapshot(); e.Reason != reasonUnavailable || b != 0 {
		t.Fatalf("t1 = %+v with %d batches, want quarantined as %s, none paid", e, b, reasonUnavailable)
	}
	c.Add(time.Hour)
	if code, body := call(t, h, "POST", "/v1/epochs/t1/retry", ""); code != http.StatusAccepted {
		t.Fatalf("retry = %d %s", code, body)
	}
	waitState(t, h, "t1", stateSettled)
	checkPaidOnce(t, w, 1<<40, 1000, 5)
	if _, _, err := h.Drain(t.Context(), time.Now().Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
}
