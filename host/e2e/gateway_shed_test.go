package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// gatedUpstream holds every request until its gate opens.
type gatedUpstream struct {
	gate chan struct{}
	hits atomic.Int64
}

func (u *gatedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.hits.Add(1)
	select {
	case <-u.gate:
	case <-r.Context().Done():
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"ok":true}`)
}

// shedLevelRE matches the gateway's log line for a change of its load
// shedding level, as the host writes the plugin's records.
// Its key-value pairs come in any order.
var (
	shedLevelRE = regexp.MustCompile(`load shedding level changed:.*`)
	shedFromRE  = regexp.MustCompile(` from=(\d)`)
	shedToRE    = regexp.MustCompile(` to=(\d)`)
)

// TestGatewayGradedShedding fills the gateway's queues behind an upstream
// that holds every request: at 90% of work_queue it sheds reads with 503
// shedding, its health is degraded and GET /readyz/gateway answers 503
// "degraded". Once the upstream answers and the queues empty, the level
// steps down one level per shed_hold and never rises again (no flapping),
// and the gateway is ready again.
func TestGatewayGradedShedding(t *testing.T) {
	const (
		workers   = 2
		workQueue = 20
		intake    = 18 // in acme's queue: 90% of work_queue, level 3, reads are shed
		shedHold  = 300 * time.Millisecond
	)
	up := &gatedUpstream{gate: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: up}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	web := "http://" + ln.Addr().String()
	var once sync.Once
	release := func() { once.Do(func() { close(up.gate) }) }
	t.Cleanup(release)

	beta := sha256.Sum256([]byte("beta-key"))
	h := startHost(t, baseConfig("5s")+walletBlock("")+gatewayBlock(web, fmt.Sprintf(`    tenant "beta" {
      api_key_sha256 = %q
    }
    workers    = %d
    work_queue = %d
    shed_hold  = %q`, hex.EncodeToString(beta[:]), workers, workQueue, shedHold)))
	readyPlugin(t, h, "gateway")
	h.waitReadiness("gateway", http.StatusOK, "ready")

	// The workers take the first requests and hold them; the rest wait
	// in acme's queue.
	var wg sync.WaitGroup
	codes := make(chan int, workers+intake)
	get := func() {
		code, _ := do(t, "GET", h.ingress+"/gw/x", nil, http.Header{"X-Api-Key": {"acme-key"}})
		codes <- code
	}
	for range workers {
		wg.Go(get)
	}
	waitFor(t, 10*time.Second, "both workers holding a request upstream", func() bool { return up.hits.Load() == workers })
	for range intake {
		wg.Go(get)
	}
	waitFor(t, 10*time.Second, fmt.Sprintf("%d requests in the tenant queues", intake), func() bool {
		v, ok := h.metric(`queue_depth{plugin="gateway",queue="intake"}`)
		return ok && v == intake
	})

	// Level 3: another tenant's read is shed at once.
	code, body := do(t, "GET", h.ingress+"/gw/y", nil, http.Header{"X-Api-Key": {"beta-key"}})
	if code != http.StatusServiceUnavailable || errorCode(body) != "shedding" {
		t.Fatalf("beta's GET with the queues at 90%% = %d %s, want 503 shedding", code, body)
	}
	// The host reads the gateway's health at its next check.
	h.waitReadiness("gateway", http.StatusServiceUnavailable, "degraded")
	if got := adminHealth(t, h, "gateway"); got != "degraded" {
		t.Errorf("the gateway's health while shedding = %q, want degraded", got)
	}

	// The upstream answers: every held and queued request is served.
	release()
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Errorf("a held or queued request = %d, want 200", c)
		}
	}
	// Three steps down, each after shed_hold of low load; health checks
	// read the level too, so nothing more needs to be sent.
	h.waitReadiness("gateway", http.StatusOK, "ready")
	if got := adminHealth(t, h, "gateway"); got == "degraded" {
		t.Errorf("the gateway's health after the queues emptied = %q, want not degraded", got)
	}

	// The level went up to 3 and then down one step at a time, never up
	// again.
	var levels []int
	for _, line := range shedLevelRE.FindAllString(h.log.String(), -1) {
		f, tt := shedFromRE.FindStringSubmatch(line), shedToRE.FindStringSubmatch(line)
		if f == nil || tt == nil {
			t.Fatalf("a shedding level line without from and to: %s", line)
		}
		from, _ := strconv.Atoi(f[1])
		to, _ := strconv.Atoi(tt[1])
		if len(levels) == 0 {
			levels = append(levels, from)
		}
		levels = append(levels, to)
	}
	top := 0
	for i, l := range levels {
		if l > levels[top] {
			top = i
		}
	}
	if len(levels) == 0 || levels[top] != 3 {
		t.Fatalf("shedding levels in the log %v, want a rise to 3\n%s", levels, h.log.String())
	}
	for i := top + 1; i < len(levels); i++ {
		if levels[i] != levels[i-1]-1 {
			t.Errorf("shedding levels in the log %v: after the top, want one step down at a time to 0", levels)
			break
		}
	}
	if levels[len(levels)-1] != 0 {
		t.Errorf("shedding levels in the log %v, want to end at 0", levels)
	}
}
