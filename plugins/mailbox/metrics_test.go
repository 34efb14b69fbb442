package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
)

// metric reads series (a name with its labels, as the exposition writes
// them) from h's metrics; ok is false when h does not export it.
func metric(t *testing.T, h *plugintest.Harness, series string) (v float64, ok bool) {
	t.Helper()
	text, err := h.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		rest, found := strings.CutPrefix(sc.Text(), series+" ")
		if !found {
			continue
		}
		v, err := strconv.ParseFloat(rest, 64)
		if err != nil {
			t.Fatalf("series %s: %v", series, err)
		}
		return v, true
	}
	return 0, false
}

// mustMetric is metric, failing the test when the series is missing.
func mustMetric(t *testing.T, h *plugintest.Harness, series string) float64 {
	t.Helper()
	v, ok := metric(t, h, series)
	if !ok {
		text, _ := h.Metrics(t.Context())
		t.Fatalf("metrics lack %s:\n%s", series, text)
	}
	return v
}

// TestReorderDepth: a message sent with a delay is overtaken by the three
// sent after it; its first delivery has reorder depth 3. A redelivery
// (not a first delivery) and another topic of the shard do not count.
func TestReorderDepth(t *testing.T) {
	clock := newFakeClock()
	h := serve(t, newDefinition(&mailbox{clock: clock}), plugintest.Options{Config: `ready_shards = 1`})
	const series = `reorder_depth_max{shard="0"}`
	// Every series a rule may read is there from the start, at 0.
	for _, s := range []string{series, `busy_rejections_total{endpoint="send"}`, `busy_rejections_total{endpoint="recv"}`,
		`busy_rejections_total{endpoint="redrive"}`, `integrity_fail_total{reason="hash"}`} {
		if got := mustMetric(t, h, s); got != 0 {
			t.Fatalf("%s at start = %v, want 0", s, got)
		}
	}
	call(t, h, "POST", "/v1/send", `{"topic":"t","payload":"YQ==","delay_ms":1000}`)
	for range 3 {
		call(t, h, "POST", "/v1/send", `{"topic":"t","payload":"Yg=="}`)
	}
	for range 5 { // sent after all of them, delivered first: another topic
		call(t, h, "POST", "/v1/send", `{"topic":"u","payload":"Yg=="}`)
	}
	if _, body := call(t, h, "POST", "/v1/recv", `{"topic":"u","max_messages":10,"visibility_ms":250}`); strings.Count(body, "msg_id") != 5 {
		t.Fatalf("recv of u = %s, want 5", body)
	}
	if _, body := call(t, h, "POST", "/v1/recv", `{"topic":"t","max_messages":10,"visibility_ms":250}`); strings.Count(body, "msg_id") != 3 {
		t.Fatalf("recv of t = %s, want the 3 undelayed", body)
	}
	if got := mustMetric(t, h, series); got != 0 {
		t.Errorf("%s after in-order deliveries = %v, want 0", series, got)
	}
	clock.add(time.Second)
	// The delayed message, and the other three again (expired): only the
	// delayed one is a first delivery.
	if _, body := call(t, h, "POST", "/v1/recv", `{"topic":"t","max_messages":10,"visibility_ms":250}`); strings.Count(body, "msg_id") != 4 {
		t.Fatalf("recv of t = %s, want 4", body)
	}
	if got := mustMetric(t, h, series); got != 3 {
		t.Errorf("%s after the delayed message = %v, want 3", series, got)
	}
}

// TestLapsedDeliveries: a delivery whose visibility ends unsettled counts
// in io_timeouts_total{op="recv"} when a receive meets its message again;
// one nacked does not.
func TestLapsedDeliveries(t *testing.T) {
	clock := newFakeClock()
	h := serve(t, newDefinition(&mailbox{clock: clock}), plugintest.Options{})
	const series = `io_timeouts_total{op="recv"}`
	call(t, h, "POST", "/v1/send", `{"topic":"t","payload":"YQ=="}`)
	call(t, h, "POST", "/v1/send", `{"topic":"n","payload":"YQ=="}`)
	call(t, h, "POST", "/v1/recv", `{"topic":"t","visibility_ms":250}`)
	_, body := call(t, h, "POST", "/v1/recv", `{"topic":"n","visibility_ms":250}`)
	var n recvAnswer
	if err := json.Unmarshal([]byte(body), &n); err != nil || len(n.Messages) != 1 {
		t.Fatalf("recv of n = %s", body)
	}
	if code, body := call(t, h, "POST", "/v1/nack", `{"msg_id":"`+n.Messages[0].MsgID+`","receipt":"`+n.Messages[0].Receipt+`","delay_ms":0}`); code != 200 {
		t.Fatalf("nack = %d %s", code, body)
	}
	clock.add(249 * time.Millisecond)
	call(t, h, "POST", "/v1/recv", `{"topic":"t"}`) // not yet expired
	if got := mustMetric(t, h, series); got != 0 {
		t.Errorf("%s before the deadline = %v, want 0", series, got)
	}
	clock.add(time.Millisecond)
	for _, topic := range []string{"t", "n"} {
		if _, body := call(t, h, "POST", "/v1/recv", `{"topic":"`+topic+`"}`); !strings.Contains(body, `"attempts":2`) {
			t.Fatalf("recv of %s = %s, want the redelivery", topic, body)
		}
	}
	if got := mustMetric(t, h, series); got != 1 {
		t.Errorf("%s after the deadline = %v, want 1 (the nacked one is not a timeout)", series, got)
	}
}

// TestDrainCancels: the drain stops the redrive in progress
// (tasks_canceled_total{kind="redrive"}) and drops the redrives still
// queued (tasks_aborted_total{kind="redrive"}). TestDrainEndsLongPoll
// checks kind recv.
func TestDrainCancels(t *testing.T) {
	g := &gate{held: make(chan struct{}, 1), open: make(chan struct{})}
	mb := &mailbox{faults: g}
	h := serve(t, newDefinition(mb), plugintest.Options{Config: `commit_timeout = "30s"`})
	if code, body := call(t, h, "POST", "/v1/redrive", `{"topic":"t","max":1}`); code != 202 {
		t.Fatalf("redrive = %d %s", code, body)
	}
	<-g.held // the redrive's chunk is in progress, its commit held
	for range 2 {
		if code, body := call(t, h, "POST", "/v1/redrive", `{"topic":"t","max":1}`); code != 202 {
			t.Fatalf("redrive = %d %s", code, body)
		}
	}
	if _, _, err := h.Drain(t.Context(), time.Now().Add(2*time.Second)); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	for series, want := range map[string]float64{
		`tasks_canceled_total{kind="redrive"}`: 1,
		`tasks_aborted_total{kind="redrive"}`:  2,
	} {
		if got := mustMetric(t, h, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}

// TestDrainEndsStream: a stream waiting for messages when the drain
// begins ends, counted in tasks_canceled_total{kind="recv_stream"}.
func TestDrainEndsStream(t *testing.T) {
	mb := &mailbox{}
	h := serve(t, newDefinition(mb), plugintest.Options{})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	resp, err := srv.Client().Get(srv.URL + "/v1/recv/stream?topic=s")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	poll(t, "stream waiting", func() bool { return waitingOn(mb, "s") })
	if _, _, err := h.Drain(t.Context(), time.Now().Add(3*time.Second)); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("read the stream to its end: %v", err)
	}
	if got := mustMetric(t, h, `tasks_canceled_total{kind="recv_stream"}`); got != 1 {
		t.Errorf(`tasks_canceled_total{kind="recv_stream"} = %v, want 1`, got)
	}
}
