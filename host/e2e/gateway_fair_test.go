package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fairBlock returns gatewayBlock in front of upstream with two workers,
// the default sched_queue and reserved worker, and a third tenant, beta
// ("beta-key", max_queue 4), whose bucket never refuses.
func fairBlock(upstream string) string {
	beta := sha256.Sum256([]byte("beta-key"))
	return walletBlock("") + gatewayBlock(upstream, fmt.Sprintf(`    workers = 2
    tenant "beta" {
      api_key_sha256 = %q
      rate_per_s     = 1000
      burst          = 1000
      max_queue      = 4
    }`, hex.EncodeToString(beta[:])))
}

// fairAnswer is the answer to one request of sendFair.
type fairAnswer struct {
	code int
	body string
}

// sendFair sends n GETs to /gw/x with key ("" for none), each on its own
// goroutine, and returns the channel their answers arrive on; onAnswer,
// if not nil, runs as each arrives.
func sendFair(t *testing.T, h *hostProc, wg *sync.WaitGroup, key string, n int, onAnswer func(fairAnswer)) chan fairAnswer {
	t.Helper()
	ch := make(chan fairAnswer, n)
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(t.Context(), "GET", h.ingress+"/gw/x", nil)
			if key != "" {
				req.Header.Set("X-Api-Key", key)
			}
			a := fairAnswer{}
			resp, err := client.Do(req)
			if err != nil {
				a.body = err.Error()
			} else {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				a = fairAnswer{resp.StatusCode, string(b)}
			}
			if onAnswer != nil {
				onAnswer(a)
			}
			ch <- a
		})
	}
	return ch
}

// TestGatewayFairAtDefaults drives the gateway at its default sched_queue
// through the real host. With acme's backlog behind two held workers,
// beta's max_queue counts every request of beta's that waits: of its 8,
// one starts on the reserved worker, 4 wait and 3 get 429 busy, while
// acme's are all served once the upstream answers. Then, with acme and
// the default tenant sending a burst to an upstream that takes 100ms,
// beta's 3 requests are served in the round-robin's turns, well before
// the noisy tenants' backlog has drained, not behind it.
func TestGatewayFairAtDefaults(t *testing.T) {
	t.Run("max_queue", func(t *testing.T) {
		up := &heldUpstream{open: make(chan struct{})}
		srv := httptest.NewServer(up)
		t.Cleanup(srv.Close)
		var once sync.Once
		release := func() { once.Do(func() { close(up.open) }) }
		t.Cleanup(release)
		h := startHost(t, baseConfig("5s")+fairBlock(srv.URL))
		readyPlugin(t, h, "gateway")
		metric := func(series string) float64 {
			v, _ := h.metric(series)
			return v
		}
		var wg sync.WaitGroup
		defer wg.Wait()
		defer release()

		waiting := func() float64 {
			return metric(`queue_depth{plugin="gateway",queue="intake"}`) + metric(`queue_depth{plugin="gateway",queue="sched"}`)
		}
		busy := func() float64 { return metric(`busy_rejections_total{endpoint="tenant",plugin="gateway"}`) }
		acme := sendFair(t, h, &wg, "acme-key", 10, nil)
		waitFor(t, 10*time.Second, "acme's 2 requests upstream and 8 waiting", func() bool {
			return up.waiting.Load() == 2 && waiting() == 8
		})
		beta := sendFair(t, h, &wg, "beta-key", 8, nil)
		waitFor(t, 10*time.Second, "beta's 8 requests started on the reserved worker, waiting or refused", func() bool {
			return up.waiting.Load() == 3 && waiting()+busy() == 15
		})
		for series, want := range map[string]float64{
			`busy_rejections_total{endpoint="tenant",plugin="gateway"}`: 3,
			`queue_depth{plugin="gateway",queue="intake"}`:              12,
			`queue_depth{plugin="gateway",queue="sched"}`:               0,
			`gateway_reserved_total{plugin="gateway"}`:                  1,
		} {
			if got := metric(series); got != want {
				t.Errorf("%s = %v, want %v", series, got, want)
			}
		}
		release()
		served := map[string]int{}
		for name, ch := range map[string]chan fairAnswer{"acme": acme, "beta": beta} {
			for range cap(ch) {
				a := <-ch
				switch {
				case a.code == http.StatusOK:
					served[name]++
				case name == "beta" && a.code == http.StatusTooManyRequests && errorCode(a.body) == "busy":
				default:
					t.Errorf("a request of %s = %d %s, want 200 or, for beta, 429 busy", name, a.code, a.body)
				}
			}
		}
		if served["acme"] != 10 || served["beta"] != 5 {
			t.Errorf("served %v, want all 10 of acme's and 5 of beta's", served)
		}
	})

	t.Run("quiet tenant", func(t *testing.T) {
		srv := httptest.NewServer(sleepyUpstream{100 * time.Millisecond})
		t.Cleanup(srv.Close)
		h := startHost(t, baseConfig("5s")+fairBlock(srv.URL))
		readyPlugin(t, h, "gateway")
		var wg sync.WaitGroup
		defer wg.Wait()

		const noisy = 35
		var noisyDone atomic.Int64
		count := func(fairAnswer) { noisyDone.Add(1) }
		acme := sendFair(t, h, &wg, "acme-key", 20, count)
		dflt := sendFair(t, h, &wg, "", 15, count)
		waitFor(t, 10*time.Second, "the noisy tenants' burst waiting", func() bool {
			v1, _ := h.metric(`queue_depth{plugin="gateway",queue="intake"}`)
			v2, _ := h.metric(`queue_depth{plugin="gateway",queue="sched"}`)
			return v1+v2 >= 25
		})
		beta := sendFair(t, h, &wg, "beta-key", 3, nil)
		for range 3 {
			if a := <-beta; a.code != http.StatusOK {
				t.Errorf("beta's request = %d %s, want 200", a.code, a.body)
			}
		}
		// Round-robin: beta's 3 requests take at most 3 rounds of 3
		// tenants; in arrival order they would wait for the whole burst.
		done := noisyDone.Load()
		t.Logf("the noisy tenants' requests answered before beta's last: %d of %d", done, noisy)
		if left := noisy - done; left < 12 {
			t.Errorf("%d of the noisy tenants' %d requests were still unanswered when beta's last was served, want at least 12: beta waited behind their backlog", left, noisy)
		}
		for name, ch := range map[string]chan fairAnswer{"acme": acme, "default": dflt} {
			for range cap(ch) {
				if a := <-ch; a.code != http.StatusOK {
					t.Errorf("a request of %s = %d %s, want 200", name, a.code, a.body)
				}
			}
		}
	})
}
