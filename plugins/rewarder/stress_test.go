package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/host/plugintest"
	"github.com/plughost/plughost/sdk/workq"
)

// TestStressDrainRace posts many epochs at once into a work queue of 2
// and one slow worker (40 ms an epoch, through the tamper hook), and begins the drain at a random moment among them.
// Each post is answered (no deadlock); 429s match busy_rejections_total;
// and every epoch acknowledged with 202 (or left queued by a 429, its
// inputs sealed) is settled by the next process on the same data
// directory, exactly once.
func TestStressDrainRace(t *testing.T) {
	tamper = func([]Payout) { time.Sleep(40 * time.Millisecond) }
	t.Cleanup(func() { tamper = nil })
	for round := range 3 {
		t.Run(strconv.Itoa(round), func(t *testing.T) {
			const epochs, pool = 40, 1000
			w := newWalletStub("pool", 1<<40)
			dir := t.TempDir()
			h := plugintest.New(t, definition(), plugintest.Options{DataDir: dir, Config: testConfig + "work_queue = 2\ncompute_workers = 1\nio_inflight = 2",
				Plugins: map[string]http.Handler{"wallet": w}})
			codes := make([]int, epochs)
			var wg sync.WaitGroup
			drainAt := rand.IntN(epochs) // that goroutine drains after a random delay, instead of posting first
			drained := make(chan struct{})
			for i := range epochs {
				wg.Go(func() {
					if i == drainAt {
						time.Sleep(time.Duration(rand.IntN(400)) * time.Millisecond)
						if _, _, err := h.Drain(context.Background(), time.Now().Add(2*time.Second)); err != nil {
							t.Errorf("Drain = %v", err)
						}
						close(drained)
					}
					codes[i], _ = call(t, h, "POST", fmt.Sprintf("/v1/epochs/s%d/compute", i), inputs(pool, 3))
				})
			}
			wg.Wait()
			<-drained
			busy := 0
			for i, c := range codes {
				switch c {
				case http.StatusAccepted, http.StatusOK, http.StatusServiceUnavailable:
				case http.StatusTooManyRequests:
					busy++
				default:
					t.Errorf("POST s%d = %d, want 202, 200, 429 or 503", i, c)
				}
			}
			if got := metric(t, h, `busy_rejections_total{endpoint="compute"}`); got != strconv.Itoa(busy) {
				t.Errorf("busy_rejections_total = %s, want the %d 429s", got, busy)
			}
			h2 := start(t, dir, "", w)
			if got := metric(t, h2, `busy_rejections_total{endpoint="compute"}`); got != "0" {
				t.Errorf("busy_rejections_total after a restart = %s, want 0", got)
			}
			settled := 0
			for i, c := range codes {
				id := fmt.Sprintf("s%d", i)
				code, _ := call(t, h2, "GET", "/v1/epochs/"+id, "")
				switch {
				case c == http.StatusAccepted || c == http.StatusOK:
					waitState(t, h2, id, stateSettled)
					settled++
				case code == http.StatusOK: // sealed, then refused with 429 or caught by the drain
					waitState(t, h2, id, stateSettled)
					settled++
				}
			}
			_, _, batches := w.snapshot()
			bal, _, _ := w.snapshot()
			if batches != settled || 1<<40-bal["pool"] != uint64(settled*pool) {
				t.Errorf("wallet: %d batches, pool debited %d; want %d epochs paid once", batches, 1<<40-bal["pool"], settled)
			}
			t.Logf("drain at post %d: %d settled, %d refused with 429", drainAt, settled, busy)
		})
	}
}

// TestScheduleBusy pins the work queue's policy: a full queue is tried
// once more after the jittered delay, then the compute is refused with
// errBusy, and the epoch is not left active (a later post or the
// rescanner can queue it).
func TestScheduleBusy(t *testing.T) {
	q, err := workq.New[string](workq.Options{Name: "work", Capacity: 1})
	must(t, err)
	var waited []time.Duration
	r := &running{work: q, active: map[string]bool{}, m: metrics{retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})},
		jitter: func(lo, hi time.Duration) time.Duration { waited = append(waited, lo, hi); return 0 }}
	must(t, r.schedule(t.Context(), "a"))
	must(t, r.schedule(t.Context(), "a")) // active: no second run, no error
	if q.Len() != 1 {
		t.Fatalf("queue holds %d, want 1: one run per epoch", q.Len())
	}
	if err := r.schedule(t.Context(), "b"); !errors.Is(err, errBusy) {
		t.Fatalf("schedule(b) on a full queue = %v, want errBusy", err)
	}
	if len(waited) != 2 || waited[0] != 50*time.Millisecond || waited[1] != 150*time.Millisecond {
		t.Errorf("retry delay drawn from %v, want [50ms 150ms]", waited)
	}
	if r.active["b"] {
		t.Error("b stays active after its refusal")
	}
	if id, err := q.Dequeue(t.Context()); err != nil || id != "a" {
		t.Fatalf("Dequeue = %q, %v", id, err)
	}
	must(t, r.schedule(t.Context(), "b"))
}
