package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
)

// TestShutdownRace is the Go stand-in for the seed's loom model: workers
// propose, approve (in random order, by random approvers, some twice) and
// read, while the drain begins at a random moment (each round draws a
// seed and logs it). The drain must return by its deadline, every worker
// must see the shutdown and stop, no proposal may commit twice, and in
// the next process every acknowledged commit is there, at its version,
// with a chain that verifies.
func TestShutdownRace(t *testing.T) {
	for round := range 4 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			seed := rand.Uint64()
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 0))
			dir := t.TempDir()
			h := plugintest.New(t, definition(), plugintest.Options{DataDir: dir, Config: approvers()})
			var (
				mu        sync.Mutex
				proposals []proposed
				committed = map[string]approved{} // proposal id → its commit
				wg        sync.WaitGroup
				stop      = make(chan struct{})
			)
			for w := range 6 {
				wseed := rng.Uint64()
				wg.Go(func() {
					r := rand.New(rand.NewPCG(wseed, uint64(w)))
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						switch r.IntN(3) {
						case 0:
							code, body := call(t, h, "POST", "/v1/proposals", fmt.Sprintf(`{"artifact":{"w":%d,"i":%d}}`, w, i))
							var p proposed
							if code == 202 && json.Unmarshal([]byte(body), &p) == nil {
								mu.Lock()
								proposals = append(proposals, p)
								mu.Unlock()
							}
						case 1:
							mu.Lock()
							if len(proposals) == 0 {
								mu.Unlock()
								continue
							}
							p := proposals[r.IntN(len(proposals))]
							mu.Unlock()
							code, a := approve(t, h, p, []string{"a", "b", "c"}[r.IntN(3)])
							if code != 200 {
								continue
							}
							mu.Lock()
							if prev, ok := committed[p.ProposalID]; ok && prev != a {
								t.Errorf("proposal %s committed as %+v and as %+v", p.ProposalID, prev, a)
							}
							committed[p.ProposalID] = a
							mu.Unlock()
						default:
							call(t, h, "GET", "/v1/head", "")
						}
					}
				})
			}
			time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond) // a random moment, not a condition
			done := make(chan struct{})
			var err error
			go func() {
				defer close(done)
				_, _, err = h.Drain(context.Background(), time.Now().Add(3*time.Second))
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Drain did not return within 10s: deadlock")
			}
			if err != nil {
				t.Errorf("Drain: %v", err)
			}
			close(stop)
			wg.Wait()
			next := serveDir(t, definition(), dir, "")
			var hd headJSON
			_, body := call(t, next, "GET", "/v1/head", "")
			json.Unmarshal([]byte(body), &hd)
			es := checkChain(t, next, hd.Version)
			versions := map[uint64]string{}
			for id, a := range committed {
				if a.Version > hd.Version || es[a.Version-1].Hash != a.Hash {
					t.Errorf("acknowledged commit of %s at %+v lost (head %d)", id, a, hd.Version)
				}
				if other, ok := versions[a.Version]; ok {
					t.Errorf("version %d acknowledged to %s and %s", a.Version, id, other)
				}
				versions[a.Version] = id
			}
			t.Logf("%d proposals, %d commits acknowledged, head %d after the restart", len(proposals), len(committed), hd.Version)
		})
	}
}
