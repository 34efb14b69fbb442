package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
	"github.com/plughost/plughost/sdk/store"
)

// keys lists bucket b's keys in rw's store.
func keys(t *testing.T, rw *rewarder, b int) []string {
	t.Helper()
	var out []string
	must(t, rw.run.db.View(func(s *store.Snapshot) error {
		s.Ascend(b, nil, nil, func(k, _ []byte) bool { out = append(out, string(k)); return true })
		return nil
	}))
	return out
}

// startWith serves newDefinition(rw) in-process, drained when the test
// ends.
func startWith(t *testing.T, rw *rewarder, dir, config string, wallet http.Handler) *plugintest.Harness {
	t.Helper()
	h := plugintest.New(t, newDefinition(rw), plugintest.Options{DataDir: dir, Config: testConfig + config, Plugins: map[string]http.Handler{"wallet": wallet}})
	t.Cleanup(func() {
		if _, _, err := h.Drain(context.Background(), time.Now().Add(5*time.Second)); err != nil {
			t.Errorf("Drain = %v", err)
		}
	})
	return h
}

// seedStore writes fn's group into a new store in dir, as a stopped
// rewarder would have left it.
func seedStore(t *testing.T, dir string, fn func(tx *store.Tx) error) {
	t.Helper()
	db, err := store.Open(filepath.Join(dir, storeFile), storeOpts)
	must(t, err)
	must(t, db.Update(fn))
	must(t, db.Close())
}

// sealQueued stores epoch id as queued with its sealed inputs; raw
// writes the record without the indexes, as a store written before them.
func sealQueued(tx *store.Tx, id string, pool uint64, raw bool) error {
	in := Inputs{PoolAccount: "pool", PoolAmount: pool, Contributions: []Contribution{{"a", 1}, {"b", 2}}}
	canonical, h := seal(id, in)
	if err := tx.Put(bucketInputs, []byte(id), canonical); err != nil {
		return err
	}
	e := epoch{Epoch: id, State: stateQueued, InputsHash: h, PoolAccount: "pool", PoolAmount: pool, CodeVersion: codeVersion}
	if raw {
		b, _ := json.Marshal(e)
		return tx.Put(bucketEpochs, []byte(id), b)
	}
	return putEpoch(tx, e)
}

// TestIndexes: once one epoch is settled and another quarantined, the
// pending index is empty and the settled index holds the settled one.
func TestIndexes(t *testing.T) {
	w := newWalletStub("pool", 1000)
	rw := &rewarder{}
	h := startWith(t, rw, "", "", w)
	call(t, h, "POST", "/v1/epochs/p1/compute", inputs(600, 5))
	waitState(t, h, "p1", stateSettled)
	call(t, h, "POST", "/v1/epochs/f1/compute", inputs(5000, 5))
	waitState(t, h, "f1", stateQuarantined)
	if got := keys(t, rw, bucketPending); len(got) != 0 {
		t.Errorf("pending index = %q, want empty", got)
	}
	if got := keys(t, rw, bucketSettled); len(got) != 1 || !strings.HasSuffix(got[0], "p1") {
		t.Errorf("settled index = %q, want p1 only", got)
	}
}

// TestRescanReadsPendingOnly: the rescanner reads the epochs of the
// pending index only, so a damaged record of an epoch not waiting for
// work does not stop it from offering one that is.
func TestRescanReadsPendingOnly(t *testing.T) {
	dir := t.TempDir()
	seedStore(t, dir, func(tx *store.Tx) error {
		if err := tx.Put(bucketMeta, keyIndexed, []byte{1}); err != nil {
			return err
		}
		if err := tx.Put(bucketEpochs, []byte("zz"), []byte("not json")); err != nil {
			return err
		}
		return sealQueued(tx, "a1", 300, false)
	})
	w := newWalletStub("pool", 1000)
	h := start(t, dir, "", w)
	waitState(t, h, "a1", stateSettled)
}

// TestIndexBuild: a store written before the indexes gets them once at
// start: its queued epoch is computed and settled, its settled one is in
// the settled index.
func TestIndexBuild(t *testing.T) {
	dir := t.TempDir()
	seedStore(t, dir, func(tx *store.Tx) error {
		b, _ := json.Marshal(epoch{Epoch: "s0", State: stateSettled, CodeVersion: codeVersion})
		if err := tx.Put(bucketEpochs, []byte("s0"), b); err != nil {
			return err
		}
		return sealQueued(tx, "a1", 300, true)
	})
	w := newWalletStub("pool", 1000)
	rw := &rewarder{}
	h := startWith(t, rw, dir, "", w)
	waitState(t, h, "a1", stateSettled)
	if got := keys(t, rw, bucketSettled); len(got) != 2 {
		t.Errorf("settled index = %q, want s0 and a1", got)
	}
}

// TestPrune: with retention = 1h on the injected clock, an epoch settled
// 75 minutes ago loses its inputs, outbox and artifacts; its run.json
// answers 410, its manifest stays (pruned), and a repeated compute
// answers it without paying again, other inputs 409. One settled 45
// minutes ago keeps everything.
func TestPrune(t *testing.T) {
	c := &clock{t: time.Now()}
	rw := &rewarder{now: c.Now}
	w := newWalletStub("pool", 1<<40)
	dir := t.TempDir()
	h := startWith(t, rw, dir, `retention = "1h"`, w)
	call(t, h, "POST", "/v1/epochs/old/compute", inputs(5000, 1500))
	waitState(t, h, "old", stateSettled)
	c.Add(30 * time.Minute)
	call(t, h, "POST", "/v1/epochs/new/compute", inputs(7000, 1500))
	waitState(t, h, "new", stateSettled)
	c.Add(45 * time.Minute)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var e epoch
		_, body := call(t, h, "GET", "/v1/epochs/old", "")
		if json.Unmarshal([]byte(body), &e) == nil && e.Pruned {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("old = %s, want pruned", body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, body := call(t, h, "GET", "/v1/epochs/old/run.json", ""); code != http.StatusGone || !strings.Contains(body, `"pruned"`) {
		t.Errorf("GET old/run.json = %d %s, want 410 pruned", code, body)
	}
	if code, _ := call(t, h, "GET", "/v1/epochs/new/run.json", ""); code != http.StatusOK {
		t.Errorf("GET new/run.json = %d, want 200", code)
	}
	for id, want := range map[string]bool{"old": false, "new": true} {
		if _, err := os.Stat(filepath.Join(dir, "artifacts", id, "run.json")); (err == nil) != want {
			t.Errorf("artifacts of %s: Stat = %v, want present %v", id, err, want)
		}
		if got := slices.Contains(keys(t, rw, bucketInputs), id); got != want {
			t.Errorf("sealed inputs of %s present = %v, want %v", id, got, want)
		}
		parts := 0
		for _, k := range keys(t, rw, bucketOutbox) {
			if strings.HasPrefix(k, id+"\x00") {
				parts++
			}
		}
		if (parts == 2) != want || (parts == 0) == want {
			t.Errorf("outbox parts of %s = %d, want present %v", id, parts, want)
		}
	}
	_, _, batches := w.snapshot()
	if code, body := call(t, h, "POST", "/v1/epochs/old/compute", inputs(5000, 1500)); code != http.StatusOK || !strings.Contains(body, `"pruned":true`) {
		t.Errorf("POST old again = %d %s, want 200 with the pruned manifest", code, body)
	}
	if code, _ := call(t, h, "POST", "/v1/epochs/old/compute", inputs(5001, 1500)); code != http.StatusConflict {
		t.Errorf("POST old with other inputs = %d, want 409", code)
	}
	if _, _, again := w.snapshot(); again != batches {
		t.Errorf("batches went from %d to %d after pruning", batches, again)
	}
	if got := metric(t, h, "rewarder_epochs_pruned_total"); got != "1" {
		t.Errorf("rewarder_epochs_pruned_total = %q, want 1", got)
	}
}
