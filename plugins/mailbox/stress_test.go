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
// send, receive, ack, nack and extend in random order (each round draws
// a seed and logs it) while the drain begins at a random moment. The drain must
// return by its deadline with nothing abandoned, every worker must see
// the shutdown and stop, no message may be acked twice, and a message
// left unacked must reappear after its visibility in the next process.
func TestShutdownRace(t *testing.T) {
	for round := range 4 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			seed := rand.Uint64()
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 0))
			dir := t.TempDir()
			h := plugintest.New(t, definition(), plugintest.Options{DataDir: dir, Config: `visibility_ms_min = 50`})
			var (
				mu    sync.Mutex
				acked = map[string]int{}
				wg    sync.WaitGroup
				stop  = make(chan struct{})
			)
			for w := range 6 {
				wseed := rng.Uint64()
				wg.Go(func() {
					r := rand.New(rand.NewPCG(wseed, uint64(w)))
					for {
						select {
						case <-stop:
							return
						default:
						}
						switch r.IntN(3) {
						case 0:
							call(t, h, "POST", "/v1/send", `{"topic":"s","payload":"YQ=="}`)
						default:
							code, body := call(t, h, "POST", "/v1/recv", fmt.Sprintf(`{"topic":"s","max_messages":%d,"visibility_ms":50,"wait_ms":%d}`, 1+r.IntN(10), r.IntN(30)))
							if code != 200 {
								continue
							}
							var a recvAnswer
							json.Unmarshal([]byte(body), &a)
							for _, m := range a.Messages {
								settle := `{"msg_id":"` + m.MsgID + `","receipt":"` + m.Receipt + `"`
								switch r.IntN(4) {
								case 0:
									call(t, h, "POST", "/v1/nack", settle+`,"delay_ms":1}`)
								case 1:
									call(t, h, "POST", "/v1/extend", settle+`,"visibility_ms":50}`)
								case 2: // leave it to expire
								}
								if code, _ := call(t, h, "POST", "/v1/ack", settle+"}"); code == 200 {
									mu.Lock()
									acked[m.MsgID]++
									mu.Unlock()
								}
							}
						}
					}
				})
			}
			time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond) // a random moment, not a condition
			done := make(chan struct{})
			var abandoned int64
			var err error
			go func() {
				defer close(done)
				_, abandoned, err = h.Drain(context.Background(), time.Now().Add(3*time.Second))
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Drain did not return within 10s: deadlock")
			}
			if err != nil || abandoned != 0 {
				t.Errorf("Drain = %d abandoned, %v; want none", abandoned, err)
			}
			close(stop)
			wg.Wait()
			for id, n := range acked {
				if n > 1 {
					t.Errorf("message %s acked %d times", id, n)
				}
			}
			// The next process: what was left unacked is there, and
			// comes back once its visibility (50ms) has passed.
			next := serve(t, definition(), plugintest.Options{DataDir: dir, Config: `visibility_ms_min = 50`})
			_, body := call(t, next, "GET", "/v1/topics/s", "")
			var st stats
			json.Unmarshal([]byte(body), &st)
			left := st.Ready + st.Inflight + st.Delayed
			got := 0
			dlqAt := func() int {
				_, b := call(t, next, "GET", "/v1/topics/s", "")
				var x stats
				json.Unmarshal([]byte(b), &x)
				return x.DLQ - st.DLQ
			}
			for deadline := time.Now().Add(5 * time.Second); got+dlqAt() < left && time.Now().Before(deadline); {
				_, body := call(t, next, "POST", "/v1/recv", `{"topic":"s","max_messages":10,"visibility_ms":60000,"wait_ms":200}`)
				var a recvAnswer
				json.Unmarshal([]byte(body), &a)
				for _, m := range a.Messages {
					if acked[m.MsgID] > 0 {
						t.Errorf("message %s delivered after its ack", m.MsgID)
					}
				}
				got += len(a.Messages)
			}
			// A message whose deliveries reached max_attempts (5) goes to
			// s.dlq at its next receive instead: the workers let
			// deliveries expire, so some may have. Every message left
			// is received or moved there.
			_, body2 := call(t, next, "GET", "/v1/topics/s", "")
			var st2 stats
			json.Unmarshal([]byte(body2), &st2)
			moved := st2.DLQ - st.DLQ
			t.Logf("%d acked before the drain, %d left: %d received after the restart, %d moved to the DLQ", len(acked), left, got, moved)
			if got+moved != left {
				t.Errorf("after restart: received %d and moved %d to the DLQ of the %d left unacked (%s, then %s)", got, moved, left, body, body2)
			}
		})
	}
}
