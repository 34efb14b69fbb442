package main

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
)

// holdWriter makes the artifact writer's first result wait for hold
// (or its context), and closes held when it does.
func holdWriter(t *testing.T, hold <-chan struct{}) (held <-chan struct{}) {
	t.Helper()
	h := make(chan struct{})
	first := true
	beforeWrite = func(ctx context.Context, _ string) {
		if !first {
			return
		}
		first = false
		close(h)
		select {
		case <-hold:
		case <-ctx.Done():
		}
	}
	t.Cleanup(func() { beforeWrite = nil })
	return h
}

// postHeld posts three epochs while the writer holds the first, and
// waits until the other two are in the results queue.
func postHeld(t *testing.T, h *plugintest.Harness, held <-chan struct{}) {
	t.Helper()
	for i := range 3 {
		if code, body := call(t, h, "POST", fmt.Sprintf("/v1/epochs/h%d/compute", i), inputs(uint64(1000+i), 5)); code != http.StatusAccepted {
			t.Fatalf("POST h%d = %d %s", i, code, body)
		}
	}
	<-held
	deadline := time.Now().Add(10 * time.Second)
	for metric(t, h, `queue_depth{queue="results"}`) != "2" {
		if time.Now().After(deadline) {
			t.Fatalf("queue_depth{queue=\"results\"} = %s, want 2", metric(t, h, `queue_depth{queue="results"}`))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestResultsFlushedAtDrain: a drain lets the artifact writer store every
// result already computed, those in the results queue too, before the
// deadline; none is dropped.
func TestResultsFlushedAtDrain(t *testing.T) {
	hold := make(chan struct{})
	held := holdWriter(t, hold)
	rw := &rewarder{}
	h := plugintest.New(t, newDefinition(rw), plugintest.Options{Config: testConfig, Plugins: map[string]http.Handler{"wallet": newWalletStub("pool", 1<<40)}})
	postHeld(t, h, held)
	drained := make(chan error, 1)
	go func() { _, _, err := h.Drain(context.Background(), time.Now().Add(5*time.Second)); drained <- err }()
	deadline := time.Now().Add(5 * time.Second)
	for rw.run.draining.Load() == false {
		if time.Now().After(deadline) {
			t.Fatal("the drain did not begin")
		}
		time.Sleep(time.Millisecond)
	}
	close(hold)
	must(t, <-drained)
	for series, want := range map[string]string{"dropped_results_total": "0", `rewarder_epochs_total{state="computed"}`: "3"} {
		if got := metric(t, h, series); got != want {
			t.Errorf("%s = %q, want %s", series, got, want)
		}
	}
}

// TestResultsDroppedAtDeadline: a writer stalled past the drain deadline
// leaves its result and the two queued behind it unstored, each counted
// in dropped_results_total; the next process computes and settles all
// three, once.
func TestResultsDroppedAtDeadline(t *testing.T) {
	held := holdWriter(t, nil) // held until the drain deadline
	dir := t.TempDir()
	w := newWalletStub("pool", 1<<40)
	h := plugintest.New(t, definition(), plugintest.Options{DataDir: dir, Config: testConfig, Plugins: map[string]http.Handler{"wallet": w}})
	postHeld(t, h, held)
	if _, _, err := h.Drain(t.Context(), time.Now().Add(500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	for series, want := range map[string]string{"dropped_results_total": "3", `tasks_aborted_total{kind="epoch"}`: "1", `rewarder_epochs_total{state="computed"}`: "0"} {
		if got := metric(t, h, series); got != want {
			t.Errorf("%s = %q, want %s", series, got, want)
		}
	}
	beforeWrite = nil
	h2 := start(t, dir, "", w)
	for i := range 3 {
		waitState(t, h2, fmt.Sprintf("h%d", i), stateSettled)
	}
	if bal, _, batches := w.snapshot(); batches != 3 || (1<<40)-bal["pool"] != 1000+1001+1002 {
		t.Errorf("%d batches debiting %d, want 3 debiting %d", batches, (1<<40)-bal["pool"], 1000+1001+1002)
	}
}

// TestComputesCanceledAtDrain: with one compute worker held in a
// computation, two epochs wait in the work queue when the drain begins;
// the worker finishes its computation, and the two are left to the next
// process, counted in rewarder_tasks_canceled_total{kind="compute"}.
func TestComputesCanceledAtDrain(t *testing.T) {
	hold, held := make(chan struct{}), make(chan struct{})
	first := true
	tamper = func([]Payout) {
		if first {
			first = false
			close(held)
			<-hold
		}
	}
	t.Cleanup(func() { tamper = nil })
	rw := &rewarder{}
	h := plugintest.New(t, newDefinition(rw), plugintest.Options{Config: testConfig + "compute_workers = 1", Plugins: map[string]http.Handler{"wallet": newWalletStub("pool", 1<<40)}})
	call(t, h, "POST", "/v1/epochs/c0/compute", inputs(1000, 5))
	<-held
	for _, id := range []string{"c1", "c2"} {
		call(t, h, "POST", "/v1/epochs/"+id+"/compute", inputs(1000, 5))
	}
	drained := make(chan error, 1)
	go func() { _, _, err := h.Drain(context.Background(), time.Now().Add(5*time.Second)); drained <- err }()
	deadline := time.Now().Add(5 * time.Second)
	for !rw.run.draining.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the drain did not begin")
		}
		time.Sleep(time.Millisecond)
	}
	close(hold)
	must(t, <-drained)
	for series, want := range map[string]string{`rewarder_tasks_canceled_total{kind="compute"}`: "2", `rewarder_epochs_total{state="computed"}`: "1"} {
		if got := metric(t, h, series); got != want {
			t.Errorf("%s = %q, want %s", series, got, want)
		}
	}
}
