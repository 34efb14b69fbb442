package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/plughost/plughost/sdk/bus"
)

// TestEvents reads GET /v1/events over a real HTTP server while an epoch
// goes through every state to settled, in order, with increasing ids.
func TestEvents(t *testing.T) {
	w := newWalletStub("pool", 1<<40)
	h := start(t, "", `event_consumers = ["ops"]`, w)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/v1/events?consumer=ops", nil)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("GET /v1/events = %d %s, want 200 text/event-stream", resp.StatusCode, ct)
	}
	call(t, h, "POST", "/v1/epochs/ev1/compute", inputs(1000, 5))
	sc := bufio.NewScanner(resp.Body)
	var got []string
	var last uint64
	for len(got) < 5 && sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "data: ") {
			continue
		}
		var ev stateEvent
		must(t, json.Unmarshal([]byte(l[6:]), &ev))
		if ev.Seq <= last || ev.Epoch != "ev1" {
			t.Fatalf("event %+v after seq %d, want a later one of ev1", ev, last)
		}
		last = ev.Seq
		got = append(got, ev.State)
	}
	want := []string{stateQueued, stateComputing, stateComputed, stateSettling, stateSettled}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("states = %v, want %v", got, want)
	}
	if code, _ := call(t, h, "GET", "/v1/events?consumer=Bad!", ""); code != http.StatusBadRequest {
		t.Errorf("GET /v1/events?consumer=Bad! = %d, want 400", code)
	}
}

// TestBusDropOldest: a consumer that does not read keeps the newest
// events_buffer events; the older ones are dropped and counted under its
// label, while publishing never blocks and a consumer with room gets
// every event.
func TestBusDropOldest(t *testing.T) {
	reg := prometheus.NewRegistry()
	b, err := newFeed(settings{eventConsumers: []string{"ops"}}, reg, nil)
	must(t, err)
	slow := b.Subscribe("ops", 2)
	stranger := b.Subscribe("someone", 1)
	roomy := b.Subscribe("ops", 8)
	for i := range 5 {
		b.publish(stateEvent{Epoch: fmt.Sprint(i)})
	}
	read := func(sub *bus.Sub[stateEvent]) (seqs []uint64, missed uint64) {
		for sub.Len() > 0 {
			ev, err := sub.Next(t.Context())
			must(t, err)
			seqs, missed = append(seqs, ev.Seq), missed+sub.Missed()
		}
		return seqs, missed
	}
	for _, tt := range []struct {
		name   string
		sub    *bus.Sub[stateEvent]
		want   string
		missed uint64
	}{
		{"slow", slow, "[4 5]", 3},
		{"stranger", stranger, "[5]", 4},
		{"roomy", roomy, "[1 2 3 4 5]", 0},
	} {
		if seqs, missed := read(tt.sub); fmt.Sprint(seqs) != tt.want || missed != tt.missed {
			t.Errorf("%s holds %v having missed %d, want %s having missed %d", tt.name, seqs, missed, tt.want, tt.missed)
		}
	}
	// Only ops and other have series: someone counts as other.
	want := fmt.Sprintf(`# HELP bus_lagged_total %s
# TYPE bus_lagged_total counter
bus_lagged_total{consumer="ops"} 3
bus_lagged_total{consumer="other"} 4
`, laggedHelp)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), bus.LaggedName); err != nil {
		t.Errorf("bus_lagged_total, want ops 3, other 4 and no series for someone: %v", err)
	}
}
