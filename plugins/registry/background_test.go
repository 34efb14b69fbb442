package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/bus"
	"github.com/plughost/plughost/sdk/group"
	"github.com/plughost/plughost/sdk/store"
)

// TestTamper flips one byte of a stored entry's artifact behind the
// committer's back: the deep verifier finds it, counts it, and makes the
// registry write-unready, while reads are still served.
func TestTamper(t *testing.T) {
	rg := &registry{verifyEvery: 10 * time.Millisecond}
	h := serve(t, newDefinition(rg), "")
	for i := range 3 {
		commit(t, h, fmt.Sprintf(`{"i":%d}`, i))
	}
	// A pass over the intact chain finds nothing.
	time.Sleep(100 * time.Millisecond) // several verifier slices; the check below is that none failed
	if hl, _ := h.Health(t.Context()); hl.Status != sdk.StatusReady {
		t.Fatalf("health of an intact log = %+v, want ready", hl)
	}
	run := rg.running.Load()
	err := run.db.Update(func(tx *store.Tx) error {
		b := tx.Get(bucketEntries, be64(2))
		i := strings.Index(string(b), `"i":1`)
		if i < 0 {
			return fmt.Errorf("entry 2 = %s", b)
		}
		b = []byte(string(b))
		b[i+4] = '7' // one byte of the artifact
		return tx.Put(bucketEntries, be64(2), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the verifier to go write-unready", func() bool {
		hl, _ := h.Health(t.Context())
		return hl.Status == sdk.StatusDegraded && strings.Contains(hl.Reason, "entry 2")
	})
	m, _ := h.Metrics(t.Context())
	if !strings.Contains(m, "registry_verify_failures_total ") || strings.Contains(m, "registry_verify_failures_total 0") {
		t.Errorf("registry_verify_failures_total did not move:\n%s", grep(m, "verify"))
	}
	if code, body := call(t, h, "POST", "/v1/proposals", `{"artifact":{}}`); code != 503 || errorCode(body) != "write_unready" {
		t.Errorf("proposal after tampering = %d %s, want 503 write_unready", code, body)
	}
	for _, v := range []int{1, 2, 3} {
		if code, _ := call(t, h, "GET", fmt.Sprintf("/v1/entries/%d", v), ""); code != 200 {
			t.Errorf("GET entry %d after tampering = %d, want 200 (reads still served)", v, code)
		}
	}
	if code, _ := call(t, h, "GET", "/v1/proof/inclusion?version=1&size=3", ""); code != 200 {
		t.Errorf("inclusion proof after tampering = %d, want 200", code)
	}
}

// TestRetention prunes the entry data below the checkpoint only: the
// pruned versions answer 410 with the covering checkpoint, the rest are
// served, HEAD stays, and proofs of pruned entries still verify.
func TestRetention(t *testing.T) {
	rg := &registry{}
	h := serve(t, newDefinition(rg), `
checkpoint_interval = "20ms"
retention {
  enabled = true
  keep_after_checkpoint = 2
}`)
	for i := range 6 {
		commit(t, h, fmt.Sprintf(`{"i":%d}`, i))
	}
	// The checkpoint covers 6; keeping 2 below it prunes 1..3.
	eventually(t, "retention to prune versions 1 to 3", func() bool {
		code, _ := call(t, h, "GET", "/v1/entries/3", "")
		return code == http.StatusGone
	})
	code, body := call(t, h, "GET", "/v1/entries/1", "")
	_, ck := call(t, h, "GET", "/v1/checkpoint", "")
	var gone struct {
		Error struct{ Code, Checkpoint string }
	}
	if code != 410 || json.Unmarshal([]byte(body), &gone) != nil || gone.Error.Code != "pruned" || gone.Error.Checkpoint != ck {
		t.Errorf("GET pruned entry 1 = %d %s, want 410 pruned with the checkpoint %q", code, body, ck)
	}
	if code, _ := call(t, h, "GET", "/v1/entries?from=2", ""); code != 410 {
		t.Errorf("GET entries from 2 = %d, want 410", code)
	}
	for v := 4; v <= 6; v++ {
		if code, _ := call(t, h, "GET", fmt.Sprintf("/v1/entries/%d", v), ""); code != 200 {
			t.Errorf("GET entry %d (kept) = %d, want 200", v, code)
		}
	}
	n, root := openCheckpoint(t, h, ck)
	if n != 6 {
		t.Fatalf("checkpoint size %d, want 6", n)
	}
	code, body = call(t, h, "GET", "/v1/proof/inclusion?version=1&size=6", "")
	if code != 200 {
		t.Fatalf("inclusion of pruned 1 = %d %s", code, body)
	}
	p, _ := decodeProof(t, body)
	if p.Root != b64Hash(root) {
		t.Errorf("proof root %s, want the checkpoint's %s", p.Root, b64Hash(root))
	}
	// HEAD is untouched and commits go on.
	if a := commit(t, h, `{"after":"prune"}`); a.Version != 7 {
		t.Errorf("commit after pruning at version %d, want 7", a.Version)
	}
}

// TestRetentionFollowsEveryCheckpoint: retention prunes below a
// checkpoint signed on demand, and below the one a start finds stored,
// not only below the checkpointer's.
func TestRetentionFollowsEveryCheckpoint(t *testing.T) {
	const retention = `
checkpoint_interval = "1h"
retention {
  enabled = true
  keep_after_checkpoint = 2
}`
	t.Run("signed on demand", func(t *testing.T) {
		h := serve(t, definition(), retention)
		for i := range 6 {
			commit(t, h, fmt.Sprintf(`{"i":%d}`, i))
		}
		if code, body := call(t, h, "POST", "/v1/checkpoint", ""); code != http.StatusOK {
			t.Fatalf("POST /v1/checkpoint = %d %s", code, body)
		}
		eventually(t, "retention to prune versions 1 to 3", func() bool {
			code, _ := call(t, h, "GET", "/v1/entries/3", "")
			return code == http.StatusGone
		})
	})
	t.Run("found at start", func(t *testing.T) {
		dir := t.TempDir()
		h := serveDir(t, definition(), dir, `checkpoint_interval = "1h"`)
		for i := range 6 {
			commit(t, h, fmt.Sprintf(`{"i":%d}`, i))
		}
		if code, body := call(t, h, "POST", "/v1/checkpoint", ""); code != http.StatusOK {
			t.Fatalf("POST /v1/checkpoint = %d %s", code, body)
		}
		if _, _, err := h.Drain(context.Background(), time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		h = serveDir(t, definition(), dir, retention)
		eventually(t, "retention to prune versions 1 to 3 after the start", func() bool {
			code, _ := call(t, h, "GET", "/v1/entries/3", "")
			return code == http.StatusGone
		})
		if code, _ := call(t, h, "GET", "/v1/entries/4", ""); code != http.StatusOK {
			t.Errorf("GET entry 4 (kept) = %d, want 200", code)
		}
	})
}

// TestStream reads the stream over a real HTTP server: catch-up from the
// store after Last-Event-ID, then live commits, in order.
func TestStream(t *testing.T) {
	h := serve(t, definition(), "")
	for i := range 3 {
		commit(t, h, fmt.Sprintf(`{"i":%d}`, i))
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/v1/stream?consumer=test", nil)
	req.Header.Set("Last-Event-ID", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	next := func() (id string, data event) {
		t.Helper()
		for sc.Scan() {
			l := sc.Text()
			switch {
			case strings.HasPrefix(l, "id: "):
				id = l[4:]
			case strings.HasPrefix(l, "data: "):
				if err := json.Unmarshal([]byte(l[6:]), &data); err != nil {
					t.Fatal(err)
				}
			case l == "" && id != "":
				return id, data
			}
		}
		t.Fatalf("stream ended: %v", sc.Err())
		return
	}
	for _, want := range []uint64{2, 3} {
		if id, ev := next(); id != fmt.Sprint(want) || ev.Version != want {
			t.Fatalf("event %s %+v, want version %d", id, ev, want)
		}
	}
	for i := range 3 {
		a := commit(t, h, fmt.Sprintf(`{"live":%d}`, i))
		if id, ev := next(); id != fmt.Sprint(a.Version) || ev.Hash != a.Hash {
			t.Fatalf("live event %s %+v, want version %d hash %s", id, ev, a.Version, a.Hash)
		}
	}
}

// TestBusLagged fills a consumer's buffer: the next event cuts it off as
// lagged, while publishing never blocks and other consumers go on.
func TestBusLagged(t *testing.T) {
	b, err := newBus(settings{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	slow, fast := b.Subscribe("slow", 2), b.Subscribe("fast", 8)
	for v := uint64(1); v <= 3; v++ {
		b.Publish(event{Version: v})
		if _, err := fast.Next(t.Context()); err != nil {
			t.Fatalf("fast consumer: %v", err)
		}
	}
	if !slow.Lagged() {
		t.Fatal("a consumer two events behind with a buffer of 2 is not lagged after the third")
	}
	if slow.Len() != 2 {
		t.Errorf("slow consumer holds %d events, want the 2 it had room for", slow.Len())
	}
	b.Publish(event{Version: 4})
	if ev, err := fast.Next(t.Context()); err != nil || ev.Version != 4 {
		t.Errorf("fast consumer got %+v, %v, want version 4", ev, err)
	}
}

// TestSweepTask: the registry's sweep deletes a proposal once its ttl is
// up on the registry's clock (an approval then finds no proposal) and
// counts it, while a committed proposal still answers a late approval
// with its version.
func TestSweepTask(t *testing.T) {
	clk := newClock()
	h := serve(t, newDefinition(&registry{now: clk.now}), `proposal_ttl = "1s"`)
	pending := propose(t, h, `{"pending":true}`)
	done := propose(t, h, `{"pending":false}`)
	approve(t, h, done, "a")
	_, committed := approve(t, h, done, "b")
	clk.advance(time.Second)
	eventually(t, "the sweep to delete the expired proposal", func() bool {
		return metric(t, h, "registry_proposals_swept_total") == 1
	})
	if code, _ := approve(t, h, pending, "a"); code != http.StatusNotFound {
		t.Errorf("approval of a swept proposal = %d, want 404", code)
	}
	for _, name := range []string{"c", "a"} {
		if code, a := approve(t, h, done, name); code != http.StatusOK || a != committed {
			t.Errorf("approval by %s of a committed proposal past its ttl = %d %+v, want 200 %+v", name, code, a, committed)
		}
	}
	if metric(t, h, `registry_store_commits_total{kind="sweep",result="committed"}`) < 1 {
		t.Errorf("no sweep went through the committer")
	}
}

// TestTaskPanic: a background task that panics is counted in
// tasks_panicked_total{kind} and restarted, and the plugin lives on;
// more than maxPanics panics within panicWindow make it degraded until
// the window has passed.
func TestTaskPanic(t *testing.T) {
	clk := newClock()
	var mu sync.Mutex
	starts := map[string]int{}
	rg := &registry{now: clk.now, verifyEvery: 10 * time.Millisecond, started: func(kind string) {
		mu.Lock()
		starts[kind]++
		n := starts[kind]
		mu.Unlock()
		if n == 1 {
			panic("injected panic in " + kind)
		}
	}}
	h := serve(t, newDefinition(rg), `checkpoint_interval = "10ms"`)
	for _, kind := range taskKinds {
		eventually(t, kind+"'s panic to be counted", func() bool {
			return metric(t, h, fmt.Sprintf("tasks_panicked_total{kind=%q}", kind)) == 1
		})
		mu.Lock()
		n := starts[kind]
		mu.Unlock()
		if n != 2 {
			t.Errorf("%s started %d times, want 2: once, and again after its panic", kind, n)
		}
	}
	// The restarted checkpointer signs.
	commit(t, h, `{"after":"panics"}`)
	eventually(t, "a checkpoint from the restarted checkpointer", func() bool {
		code, _ := call(t, h, "GET", "/v1/checkpoint", "")
		return code == http.StatusOK
	})
	if hl, _ := h.Health(t.Context()); hl.Status != sdk.StatusReady {
		t.Fatalf("health after %d panics = %+v, want ready", len(taskKinds), hl)
	}
	run := rg.running.Load()
	for range maxPanics - len(taskKinds) {
		run.restarting("verifier", fmt.Errorf("recovered: %w", group.ErrPanic))
	}
	if hl, _ := h.Health(t.Context()); hl.Status != sdk.StatusReady {
		t.Errorf("health after %d panics within %v = %+v, want ready", maxPanics, panicWindow, hl)
	}
	run.restarting("verifier", fmt.Errorf("recovered: %w", group.ErrPanic))
	if hl, _ := h.Health(t.Context()); hl.Status != sdk.StatusDegraded {
		t.Errorf("health after %d panics within %v = %+v, want degraded", maxPanics+1, panicWindow, hl)
	}
	clk.advance(panicWindow)
	if hl, _ := h.Health(t.Context()); hl.Status != sdk.StatusReady {
		t.Errorf("health once the panics are %v old = %+v, want ready", panicWindow, hl)
	}
}

// TestLaggedLabel: bus_lagged_total labels a lagged consumer by its name
// only when stream_consumers lists it; every other name, however many
// clients choose, counts under one "other" series.
func TestLaggedLabel(t *testing.T) {
	reg := prometheus.NewRegistry()
	b, err := newBus(settings{streamConsumers: []string{"indexer"}}, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"indexer", "client-1", "client-2", "anonymous"} {
		b.Subscribe(name, 1)
	}
	b.Publish(event{Version: 1})
	b.Publish(event{Version: 2}) // each buffer of 1 is full: all four lag
	want := fmt.Sprintf(`# HELP bus_lagged_total %s
# TYPE bus_lagged_total counter
bus_lagged_total{consumer="indexer"} 1
bus_lagged_total{consumer="other"} 3
`, laggedHelp)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), bus.LaggedName); err != nil {
		t.Errorf("bus_lagged_total, want only indexer 1 and other 3: %v", err)
	}
}
