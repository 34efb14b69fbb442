package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRewarderEventsLagged follows the rewarder's /v1/events through the
// real host with a raw client that stops reading its socket (a receive
// buffer of 4 KiB, the host's stream credit at its minimum, the
// rewarder's events_buffer at 8) while epochs settle through the real
// wallet: its oldest events are dropped and counted in
// bus_lagged_total{consumer="slow"}, and every epoch still settles. A
// consumer that reads all along gets every event in order, and, should
// the machine's load hold it back past its buffer, lagged events that
// account for every event it lost.
// Read again, the slow socket's stream goes on past its lagged events,
// and the events they report missing are exactly the gaps in its ids.
func TestRewarderEventsLagged(t *testing.T) {
	top := strings.NewReplacer("max_body_bytes  = 4096", "max_body_bytes  = 65536\n  stream_buffer   = 4096",
		`request_timeout = "5s"`, `request_timeout = "60s"`).Replace(baseConfig("2s"))
	h := startHost(t, top+rewarderWallet()+pluginBlock("rewarder", "rewarder", `  config {
    rescan          = "100ms"
    events_buffer   = 8
    event_consumers = ["slow", "fast"]
  }`))
	readyPlugin(t, h, "wallet")
	readyPlugin(t, h, "rewarder")
	ctJSON := http.Header{"Content-Type": {"application/json"}}
	if code, body := do(t, "POST", h.ingress+"/wallet/v1/issue", strings.NewReader(`{"to":"pool","amount":1000000000}`),
		http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {"fund-pool"}}); code != http.StatusOK {
		t.Fatalf("issue to the pool = %d %s", code, body)
	}

	conn, resp := slowStream(t, h, "/rewarder/v1/events?consumer=slow")
	// From here the slow client reads nothing until it lagged; the fast
	// one reads all along.
	fast := followLagging(t, h.ingress+"/rewarder/v1/events?consumer=fast", 120*time.Second)
	settled := func(id string) bool {
		code, body := h.get(h.ingress + "/rewarder/v1/epochs/" + id)
		var m rewarderManifest
		return code == http.StatusOK && jsonDecode(body, &m) && m.State == "settled"
	}
	// Rounds of 20 epochs, 5 state changes each, until the slow consumer
	// lags; every epoch settles meanwhile.
	epochs := 0
	for round := 0; !h.busLagged("slow"); round++ {
		if round == 40 {
			t.Fatalf("no lag after %d epochs", epochs)
		}
		for range 20 {
			id := fmt.Sprintf("ev%04d", epochs)
			epochs++
			if code, body := do(t, "POST", h.ingress+"/rewarder/v1/epochs/"+id+"/compute", strings.NewReader(rewarderInputs(id, 30, 3)), ctJSON); code != http.StatusAccepted {
				t.Fatalf("POST %s = %d %s", id, code, body)
			}
		}
		last := fmt.Sprintf("ev%04d", epochs-1)
		waitFor(t, 30*time.Second, last+" settled", func() bool { return settled(last) })
	}
	t.Logf("the slow consumer lagged within %d epochs", epochs)
	for i := range epochs {
		if id := fmt.Sprintf("ev%04d", i); !settled(id) {
			waitFor(t, 30*time.Second, id+" settled", func() bool { return settled(id) })
		}
	}
	events := uint64(epochs * 5)
	waitFor(t, 30*time.Second, "the fast consumer to read every event", func() bool { return fast.last.Load() == events || fast.bad.Load() != nil })
	if bad := fast.bad.Load(); bad != nil {
		t.Fatalf("the consumer that reads all along got %v", bad)
	}
	if m, g := fast.missed.Load(), fast.gaps.Load(); m != g {
		t.Errorf("the consumer that reads all along lost %d events, and its lagged events report %d", g, m)
	} else if g > 0 {
		t.Logf("the consumer that reads all along fell behind its buffer of 8 and lost %d events, each reported", g)
	}

	// The slow stream, read now: events in increasing order, lagged events
	// in between that account for every gap, up to the last event.
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	sc := bufio.NewScanner(resp.Body)
	var kind string
	var prev, missed, gaps, lags uint64
	for prev < events && sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "event: "):
			kind = l[len("event: "):]
		case strings.HasPrefix(l, "data: ") && kind == "lagged":
			var lag struct {
				Missed uint64 `json:"missed"`
			}
			if json.Unmarshal([]byte(l[len("data: "):]), &lag) != nil || lag.Missed == 0 {
				t.Fatalf("lagged event %q", l)
			}
			missed += lag.Missed
			lags++
		case strings.HasPrefix(l, "id: "):
			n, _ := strconv.ParseUint(l[len("id: "):], 10, 64)
			if n <= prev {
				t.Fatalf("event id %d after %d", n, prev)
			}
			gaps += n - prev - 1
			prev = n
		}
	}
	if prev != events || lags == 0 || missed != gaps {
		t.Fatalf("slow stream: up to id %d of %d, %d lagged events reporting %d missed, %d ids missing; want every id accounted for", prev, events, lags, missed, gaps)
	}
}
