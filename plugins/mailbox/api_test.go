package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
	"github.com/plughost/plughost/sdk"
)

// call sends one request through h and returns the status and the body.
func call(t *testing.T, h http.Handler, method, path, body string, hdr ...string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// serve serves def in-process and drains it when the test ends, so that
// its goroutines are gone before goleak looks. A second drain (the test's
// own) is a no-op.
func serve(t *testing.T, def sdk.Plugin, opts plugintest.Options) *plugintest.Harness {
	t.Helper()
	h := plugintest.New(t, def, opts)
	t.Cleanup(func() { _, _, _ = h.Drain(context.Background(), time.Now().Add(5*time.Second)) })
	return h
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func errorCode(body string) string {
	var e struct{ Error struct{ Code string } }
	_ = json.Unmarshal([]byte(body), &e)
	return e.Error.Code
}

type recvAnswer struct {
	Messages []struct {
		MsgID       string `json:"msg_id"`
		Receipt     string
		PayloadHash string `json:"payload_hash"`
		Payload     []byte
		Attempts    int
	}
}

func TestRefusedRequests(t *testing.T) {
	h := serve(t, definition(), plugintest.Options{Config: `max_message_bytes = 4`})
	tests := []struct {
		name, path, body string
		code             int
		want             string
	}{
		{"unknown field", "/v1/send", `{"topic":"t","payload":"YQ==","bogus":1}`, 400, "bad_request"},
		{"no payload", "/v1/send", `{"topic":"t"}`, 400, "bad_request"},
		{"bad base64", "/v1/send", `{"topic":"t","payload":"!!"}`, 400, "bad_request"},
		{"bad topic", "/v1/send", `{"topic":"a/b","payload":"YQ=="}`, 400, "bad_request"},
		{"topic .. a path segment", "/v1/send", `{"topic":"..","payload":"YQ=="}`, 400, "bad_request"},
		{"topic . a path segment", "/v1/send", `{"topic":".","payload":"YQ=="}`, 400, "bad_request"},
		{"trailing data", "/v1/send", `{"topic":"t","payload":"YQ=="} {}`, 400, "bad_request"},
		{"too large", "/v1/send", `{"topic":"t","payload":"` + b64("abcde") + `"}`, 413, "too_large"},
		{"hash mismatch", "/v1/send", `{"topic":"t","payload":"YQ==","payload_hash":"` + hexHash(HashOf([]byte("b"))) + `"}`, 400, "payload_hash_mismatch"},
		{"recv unknown field", "/v1/recv", `{"topic":"t","max":3}`, 400, "bad_request"},
		{"recv batch too big", "/v1/recv", `{"topic":"t","max_messages":11}`, 400, "bad_request"},
		{"recv visibility below min", "/v1/recv", `{"topic":"t","visibility_ms":249}`, 400, "bad_request"},
		{"recv wait too long", "/v1/recv", `{"topic":"t","wait_ms":20001}`, 400, "bad_request"},
		{"ack with delay", "/v1/ack", `{"msg_id":"0000000000000001","receipt":"0000000000000001.0000000000000002","delay_ms":1}`, 400, "bad_request"},
		{"ack bad receipt", "/v1/ack", `{"msg_id":"0000000000000001","receipt":"x"}`, 400, "bad_request"},
		{"ack receipt of another message", "/v1/ack", `{"msg_id":"0000000000000001","receipt":"0000000000000002.0000000000000003"}`, 400, "bad_request"},
		{"ack unknown message", "/v1/ack", `{"msg_id":"0000000000000001","receipt":"0000000000000001.0000000000000003"}`, 404, "not_found"},
		{"extend without visibility", "/v1/extend", `{"msg_id":"0000000000000001","receipt":"0000000000000001.0000000000000003"}`, 400, "bad_request"},
		{"redrive max 0", "/v1/redrive", `{"topic":"t","max":0}`, 400, "bad_request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := call(t, h, "POST", tt.path, tt.body)
			if code != tt.code || errorCode(body) != tt.want {
				t.Errorf("POST %s %s = %d %s, want %d %s", tt.path, tt.body, code, body, tt.code, tt.want)
			}
		})
	}
}

func TestSendReceiveAck(t *testing.T) {
	h := serve(t, definition(), plugintest.Options{})
	code, body := call(t, h, "POST", "/v1/send", `{"topic":"t","payload":"`+b64("hello")+`","attrs":{"k":"v"},"payload_hash":"`+hexHash(HashOf([]byte("hello")))+`"}`)
	if code != 200 {
		t.Fatalf("send = %d %s", code, body)
	}
	code, body = call(t, h, "POST", "/v1/recv", `{"topic":"t","max_messages":10,"visibility_ms":250}`)
	var got recvAnswer
	if code != 200 || json.Unmarshal([]byte(body), &got) != nil || len(got.Messages) != 1 || string(got.Messages[0].Payload) != "hello" ||
		got.Messages[0].PayloadHash != hexHash(HashOf([]byte("hello"))) {
		t.Fatalf("recv = %d %s, want hello with its hash", code, body)
	}
	m := got.Messages[0]
	settle := `{"msg_id":"` + m.MsgID + `","receipt":"` + m.Receipt + `"}`
	if code, body := call(t, h, "POST", "/v1/extend", `{"msg_id":"`+m.MsgID+`","receipt":"`+m.Receipt+`","visibility_ms":60000}`); code != 200 {
		t.Fatalf("extend = %d %s", code, body)
	}
	if code, body := call(t, h, "GET", "/v1/topics/t", ""); code != 200 || !strings.Contains(body, `"inflight":1`) {
		t.Errorf("topic stats = %d %s, want 1 in flight", code, body)
	}
	if code, body := call(t, h, "POST", "/v1/ack", settle); code != 200 {
		t.Fatalf("ack = %d %s", code, body)
	}
	if code, body := call(t, h, "POST", "/v1/ack", settle); code != 404 {
		t.Errorf("second ack = %d %s, want 404", code, body)
	}
}

func TestStaleReceipt(t *testing.T) {
	clock := newFakeClock()
	h := serve(t, newDefinition(&mailbox{clock: clock}), plugintest.Options{})
	call(t, h, "POST", "/v1/send", `{"topic":"t","payload":"YQ=="}`)
	var first, second recvAnswer
	_, body := call(t, h, "POST", "/v1/recv", `{"topic":"t","visibility_ms":1000}`)
	json.Unmarshal([]byte(body), &first)
	clock.add(time.Second)
	_, body = call(t, h, "POST", "/v1/recv", `{"topic":"t","visibility_ms":1000}`)
	json.Unmarshal([]byte(body), &second)
	if len(first.Messages) != 1 || len(second.Messages) != 1 || second.Messages[0].Attempts != 2 {
		t.Fatalf("deliveries = %+v, %+v; want one each, the second attempt 2", first, second)
	}
	old := first.Messages[0]
	if code, body := call(t, h, "POST", "/v1/ack", `{"msg_id":"`+old.MsgID+`","receipt":"`+old.Receipt+`"}`); code != 409 || errorCode(body) != "stale_receipt" {
		t.Errorf("ack with the earlier receipt = %d %s, want 409 stale_receipt", code, body)
	}
	cur := second.Messages[0]
	if code, body := call(t, h, "POST", "/v1/ack", `{"msg_id":"`+cur.MsgID+`","receipt":"`+cur.Receipt+`"}`); code != 200 {
		t.Errorf("ack with the current receipt = %d %s, want 200", code, body)
	}
}

// TestWallClockStep: a delivery's visibility is measured on the
// monotonic clock while the mailbox runs, so a step of the wall clock,
// back or forward, makes it reappear neither early nor late; across a
// restart the stored deadline (wall clock) holds.
func TestWallClockStep(t *testing.T) {
	recv := func(t *testing.T, h http.Handler) recvAnswer {
		t.Helper()
		code, body := call(t, h, "POST", "/v1/recv", `{"topic":"t","visibility_ms":1000}`)
		var a recvAnswer
		if code != 200 || json.Unmarshal([]byte(body), &a) != nil {
			t.Fatalf("recv = %d %s", code, body)
		}
		return a
	}
	for _, tt := range []struct {
		name    string
		step    time.Duration // of the wall clock alone, once delivered
		restart bool          // after half the visibility
	}{
		{"wall clock back an hour", -time.Hour, false},
		{"wall clock forward an hour", time.Hour, false},
		{"wall clock back a second", -time.Second, false},
		{"restart", 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clock, dir := newFakeClock(), t.TempDir()
			h := serve(t, newDefinition(&mailbox{clock: clock}), plugintest.Options{DataDir: dir})
			if code, body := call(t, h, "POST", "/v1/send", `{"topic":"t","payload":"YQ=="}`); code != 200 {
				t.Fatalf("send = %d %s", code, body)
			}
			if a := recv(t, h); len(a.Messages) != 1 {
				t.Fatalf("first recv = %+v, want the message", a)
			}
			clock.step(tt.step)
			clock.add(500 * time.Millisecond)
			if tt.restart {
				if _, _, err := h.Drain(t.Context(), time.Now().Add(2*time.Second)); err != nil {
					t.Fatal(err)
				}
				h = serve(t, newDefinition(&mailbox{clock: clock}), plugintest.Options{DataDir: dir})
			}
			clock.add(499 * time.Millisecond)
			if a := recv(t, h); len(a.Messages) != 0 {
				t.Fatalf("recv 1ms before the deadline = %+v, want nothing: the delivery reappeared early", a)
			}
			clock.add(time.Millisecond)
			if a := recv(t, h); len(a.Messages) != 1 || a.Messages[0].Attempts != 2 {
				t.Fatalf("recv at the deadline = %+v, want the redelivery: it reappeared late", a)
			}
		})
	}
}

// fakeClock is the mailbox's clock in tests, moved by hand: add moves
// both its readings, as time passing does; step moves only the wall
// clock's, as an NTP correction does.
type fakeClock struct {
	mu   sync.Mutex
	wall time.Time
	mono time.Duration
}

// newFakeClock is a fakeClock at the machine's time.
func newFakeClock() *fakeClock { return &fakeClock{wall: time.Now()} }

func (c *fakeClock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.wall }
func (c *fakeClock) Mono() time.Duration { c.mu.Lock(); defer c.mu.Unlock(); return c.mono }

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.wall, c.mono = c.wall.Add(d), c.mono+d
	c.mu.Unlock()
}

func (c *fakeClock) step(d time.Duration) {
	c.mu.Lock()
	c.wall = c.wall.Add(d)
	c.mu.Unlock()
}

func TestConcurrentSendsOneKey(t *testing.T) {
	h := serve(t, definition(), plugintest.Options{})
	var wg sync.WaitGroup
	ids := make(chan string, 16)
	for range 16 {
		wg.Go(func() {
			for {
				code, body := call(t, h, "POST", "/v1/send", `{"topic":"t","payload":"YQ=="}`, "Idempotency-Key", "one")
				if code == 409 { // the first is still in progress: retry
					continue
				}
				var a struct {
					MsgID string `json:"msg_id"`
				}
				if code != 200 || json.Unmarshal([]byte(body), &a) != nil {
					t.Errorf("send = %d %s", code, body)
					return
				}
				ids <- a.MsgID
				return
			}
		})
	}
	wg.Wait()
	close(ids)
	seen := map[string]bool{}
	for id := range ids {
		seen[id] = true
	}
	if len(seen) != 1 {
		t.Errorf("16 sends with one key got ids %v, want one", seen)
	}
	if code, body := call(t, h, "GET", "/v1/topics/t", ""); !strings.Contains(body, `"ready":1,`) {
		t.Errorf("topic stats = %d %s, want one message", code, body)
	}
}

func TestKeyAfterRestart(t *testing.T) {
	dir := t.TempDir()
	h := serve(t, definition(), plugintest.Options{DataDir: dir})
	_, first := call(t, h, "POST", "/v1/send", `{"topic":"t","payload":"YQ=="}`, "Idempotency-Key", "k")
	if _, _, err := h.Drain(t.Context(), time.Now().Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	next := serve(t, definition(), plugintest.Options{DataDir: dir})
	code, again := call(t, next, "POST", "/v1/send", `{"topic":"t","payload":"YQ=="}`, "Idempotency-Key", "k")
	if code != 200 || strings.Replace(first, "false", "true", 1) != again {
		t.Errorf("send after restart = %d %s, want %s as a duplicate", code, again, first)
	}
}

func TestLongPollWakesOnSend(t *testing.T) {
	mb := &mailbox{}
	h := serve(t, newDefinition(mb), plugintest.Options{})
	type answer struct {
		code int
		body string
		took time.Duration
	}
	done := make(chan answer, 1)
	started := make(chan struct{})
	go func() {
		close(started)
		start := time.Now()
		code, body := call(t, h, "POST", "/v1/recv", `{"topic":"t","wait_ms":20000}`)
		done <- answer{code, body, time.Since(start)}
	}()
	<-started
	// Wait until the poll is parked on the topic, then send.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if waitingOn(mb, "t") || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond) // polling a condition, with a deadline
	}
	call(t, h, "POST", "/v1/send", `{"topic":"t","payload":"YQ=="}`)
	select {
	case a := <-done:
		if a.code != 200 || !strings.Contains(a.body, `"payload":"YQ=="`) || a.took > 10*time.Second {
			t.Errorf("long poll = %d %s after %v, want the message well before the wait ends", a.code, a.body, a.took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("long poll did not return within 10s of the send")
	}
}

// waitingOn reports whether a long poll of mb waits on topic.
func waitingOn(mb *mailbox, topic string) bool {
	run := mb.running.Load()
	if run == nil {
		return false
	}
	run.wakers.mu.Lock()
	defer run.wakers.mu.Unlock()
	_, ok := run.wakers.ch[topic]
	return ok
}

// poll calls cond until it holds or 5s pass.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, with a deadline
	}
}

func TestDeadLetterAndRedrive(t *testing.T) {
	clock := newFakeClock()
	h := serve(t, newDefinition(&mailbox{clock: clock}), plugintest.Options{Config: `max_attempts = 2`})
	for _, p := range []string{"a", "b"} {
		call(t, h, "POST", "/v1/send", `{"topic":"t","payload":"`+b64(p)+`"}`)
	}
	// Two deliveries of each, both expired: the next look moves them.
	for range 2 {
		if code, body := call(t, h, "POST", "/v1/recv", `{"topic":"t","max_messages":10,"visibility_ms":250}`); code != 200 || strings.Count(body, "msg_id") != 2 {
			t.Fatalf("recv = %d %s, want both", code, body)
		}
		clock.add(250 * time.Millisecond)
	}
	if code, body := call(t, h, "POST", "/v1/recv", `{"topic":"t","max_messages":10}`); code != 200 || body != "{\"messages\":[]}\n" {
		t.Fatalf("recv after max_attempts = %d %s, want none", code, body)
	}
	if _, body := call(t, h, "GET", "/v1/topics/t", ""); !strings.Contains(body, `"dlq":2`) {
		t.Fatalf("stats = %s, want 2 in the DLQ", body)
	}
	// Terminate sends one straight to the DLQ.
	call(t, h, "POST", "/v1/send", `{"topic":"t","payload":"Yw=="}`)
	_, body := call(t, h, "POST", "/v1/recv", `{"topic":"t"}`)
	var c recvAnswer
	json.Unmarshal([]byte(body), &c)
	if len(c.Messages) != 1 {
		t.Fatalf("recv = %s, want c", body)
	}
	if code, body := call(t, h, "POST", "/v1/terminate", `{"msg_id":"`+c.Messages[0].MsgID+`","receipt":"`+c.Messages[0].Receipt+`"}`); code != 200 {
		t.Fatalf("terminate = %d %s", code, body)
	}
	if code, body := call(t, h, "POST", "/v1/redrive", `{"topic":"t","max":2,"rate_per_s":100}`); code != 202 {
		t.Fatalf("redrive = %d %s, want 202", code, body)
	}
	poll(t, "redrive of 2", func() bool {
		_, body := call(t, h, "GET", "/v1/topics/t", "")
		return strings.Contains(body, `"ready":2,`) && strings.Contains(body, `"dlq":1`)
	})
	_, body = call(t, h, "POST", "/v1/recv", `{"topic":"t","max_messages":10}`)
	var back recvAnswer
	json.Unmarshal([]byte(body), &back)
	if len(back.Messages) != 2 || back.Messages[0].Attempts != 1 || back.Messages[1].Attempts != 1 {
		t.Errorf("recv after redrive = %s, want two messages with attempts reset", body)
	}
}

func TestDrainEndsLongPoll(t *testing.T) {
	mb := &mailbox{}
	h := serve(t, newDefinition(mb), plugintest.Options{})
	done := make(chan int, 1)
	go func() {
		code, _ := call(t, h, "POST", "/v1/recv", `{"topic":"t","wait_ms":20000}`)
		done <- code
	}()
	poll(t, "long poll parked", func() bool { return waitingOn(mb, "t") })
	start := time.Now()
	if _, abandoned, err := h.Drain(t.Context(), time.Now().Add(3*time.Second)); err != nil || abandoned != 0 {
		t.Fatalf("Drain = %d abandoned, %v; want none", abandoned, err)
	}
	select {
	case code := <-done:
		if code != 200 || time.Since(start) > 2*time.Second {
			t.Errorf("long poll ended %d after %v of drain, want 200 at once", code, time.Since(start))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("long poll still waiting 5s after the drain")
	}
	if code, _ := call(t, h, "POST", "/v1/send", `{"topic":"t","payload":"YQ=="}`); code != 503 {
		t.Errorf("send after drain = %d, want 503", code)
	}
	if got := mustMetric(t, h, `tasks_canceled_total{kind="recv"}`); got != 1 {
		t.Errorf(`tasks_canceled_total{kind="recv"} = %v, want 1`, got)
	}
}

// gate is a fault injector that holds every commit until opened.
type gate struct {
	held chan struct{} // receives once per commit held
	open chan struct{}
}

func (g *gate) Inject(ctx context.Context, _ string) error {
	select {
	case g.held <- struct{}{}:
	default:
	}
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func TestShardFull(t *testing.T) {
	g := &gate{held: make(chan struct{}, 1), open: make(chan struct{})}
	h := serve(t, newDefinition(&mailbox{faults: g}), plugintest.Options{Config: `
ready_shards = 1
shard_capacity = 1
commit_timeout = "30s"`})
	first := make(chan int, 1)
	go func() {
		code, _ := call(t, h, "POST", "/v1/send", `{"topic":"t","payload":"YQ=="}`)
		first <- code
	}()
	<-g.held // the first send is in progress, its commit held
	const saturation = `saturation{queue="intake",shard="0"}`
	if got := mustMetric(t, h, saturation); got != 1 {
		t.Errorf("%s with the shard's one send in progress = %v, want 1", saturation, got)
	}
	req := httptest.NewRequest("POST", "/v1/send", strings.NewReader(`{"topic":"u","payload":"YQ=="}`))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 429 || errorCode(rec.Body.String()) != "shard_full" || rec.Header().Get("Retry-After") == "" {
		t.Errorf("send to a full shard = %d %s (Retry-After %q), want 429 shard_full with Retry-After", rec.Code, rec.Body, rec.Header().Get("Retry-After"))
	}
	close(g.open)
	if code := <-first; code != 200 {
		t.Errorf("the held send = %d, want 200 once released", code)
	}
	if code, body := call(t, h, "POST", "/v1/send", `{"topic":"u","payload":"YQ=="}`); code != 200 {
		t.Errorf("send after the shard drained = %d %s, want 200", code, body)
	}
	m, err := h.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m, `busy_rejections_total{endpoint="send"} 1`+"\n") {
		t.Errorf("metrics lack busy_rejections_total{endpoint=\"send\"} 1:\n%s", m)
	}
	if got := mustMetric(t, h, saturation); got != 0 {
		t.Errorf("%s with no send in progress = %v, want 0", saturation, got)
	}
}

// TestRedeliveryDrift measures how late a long poll gets a message whose
// visibility expired: the poll wakes at the topic's nearest deadline, so
// every sample must come within 100ms of it (the bound).
func TestRedeliveryDrift(t *testing.T) {
	h := serve(t, definition(), plugintest.Options{})
	const samples = 8
	var drifts []time.Duration
	for i := range samples {
		topic := fmt.Sprintf("drift-%d", i)
		call(t, h, "POST", "/v1/send", `{"topic":"`+topic+`","payload":"YQ=="}`)
		code, body := call(t, h, "POST", "/v1/recv", `{"topic":"`+topic+`","visibility_ms":250}`)
		granted := time.Now() // the deadline is at most 250ms after this
		if code != 200 || !strings.Contains(body, "msg_id") {
			t.Fatalf("recv = %d %s", code, body)
		}
		code, body = call(t, h, "POST", "/v1/recv", `{"topic":"`+topic+`","visibility_ms":250,"wait_ms":5000}`)
		if code != 200 || !strings.Contains(body, `"attempts":2`) {
			t.Fatalf("long poll = %d %s, want the redelivery", code, body)
		}
		drifts = append(drifts, time.Since(granted)-250*time.Millisecond)
	}
	slices.Sort(drifts)
	t.Logf("drift past the deadline (upper bound), sorted: %v", drifts)
	if worst := drifts[len(drifts)-1]; worst > 100*time.Millisecond {
		t.Errorf("worst redelivery drift %v, want at most 100ms", worst)
	}
	// Each long poll woke by its timer at the deadline at least once.
	n := mustMetric(t, h, "scanner_wake_jitter_seconds_count")
	if n < samples {
		t.Errorf("scanner_wake_jitter_seconds_count = %v, want at least %d", n, samples)
	}
	if sum := mustMetric(t, h, "scanner_wake_jitter_seconds_sum"); sum < 0 || sum > 0.1*n {
		t.Errorf("scanner_wake_jitter_seconds_sum = %v over %v wakes, want a mean lateness of 0 to 100ms", sum, n)
	}
}

func TestInflightCap(t *testing.T) {
	clock := newFakeClock()
	dir := t.TempDir()
	cfg := `global_inflight = 2`
	h := serve(t, newDefinition(&mailbox{clock: clock}), plugintest.Options{Config: cfg, DataDir: dir})
	for range 3 {
		call(t, h, "POST", "/v1/send", `{"topic":"t","payload":"YQ=="}`)
	}
	_, body := call(t, h, "POST", "/v1/recv", `{"topic":"t","max_messages":2,"visibility_ms":1000}`)
	var two recvAnswer
	json.Unmarshal([]byte(body), &two)
	if len(two.Messages) != 2 {
		t.Fatalf("recv 2 = %s", body)
	}
	if code, body := call(t, h, "POST", "/v1/recv", `{"topic":"t"}`); code != 429 || errorCode(body) != "inflight_cap" {
		t.Errorf("recv at the cap = %d %s, want 429 inflight_cap", code, body)
	}
	// After a restart the count is rebuilt from the store.
	if _, _, err := h.Drain(t.Context(), time.Now().Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	h = serve(t, newDefinition(&mailbox{clock: clock}), plugintest.Options{Config: cfg, DataDir: dir})
	if code, body := call(t, h, "POST", "/v1/recv", `{"topic":"t"}`); code != 429 {
		t.Errorf("recv at the cap after a restart = %d %s, want 429", code, body)
	}
	m := two.Messages[0]
	call(t, h, "POST", "/v1/ack", `{"msg_id":"`+m.MsgID+`","receipt":"`+m.Receipt+`"}`)
	if code, body := call(t, h, "POST", "/v1/recv", `{"topic":"t"}`); code != 200 || !strings.Contains(body, "msg_id") {
		t.Errorf("recv after an ack = %d %s, want a message", code, body)
	}
	if code, _ := call(t, h, "POST", "/v1/recv", `{"topic":"t"}`); code != 429 {
		t.Errorf("recv at the cap again = %d, want 429", code)
	}
	clock.add(time.Second) // the other delivery expires: below the cap
	if code, body := call(t, h, "POST", "/v1/recv", `{"topic":"t"}`); code != 200 || !strings.Contains(body, `"attempts":2`) {
		t.Errorf("recv after an expiry = %d %s, want the expired message", code, body)
	}
}

// TestInflightCapConcurrent: receives running at once, each asking for
// up to 10 messages, never take more than global_inflight between them,
// and together take all of it. The in-flight count is read from the
// receives' answers and from the topic's counts.
func TestInflightCapConcurrent(t *testing.T) {
	const limit, receivers = 7, 32
	clock := newFakeClock()
	h := serve(t, newDefinition(&mailbox{clock: clock}), plugintest.Options{Config: fmt.Sprintf(`global_inflight = %d`, limit)})
	entries := strings.TrimSuffix(strings.Repeat(`{"topic":"t","payload":"YQ=="},`, 10), ",")
	for range receivers / 2 {
		if code, body := call(t, h, "POST", "/v1/send/batch", `{"entries":[`+entries+`]}`); code != 200 {
			t.Fatalf("send batch = %d %s", code, body)
		}
	}
	for round := range 3 { // each round's deliveries expire before the next
		var got atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range receivers {
			wg.Go(func() {
				<-start
				code, body := call(t, h, "POST", "/v1/recv", `{"topic":"t","max_messages":10,"visibility_ms":250}`)
				var a recvAnswer
				if code == 200 && json.Unmarshal([]byte(body), &a) == nil {
					got.Add(int64(len(a.Messages)))
				} else if code != 429 || errorCode(body) != "inflight_cap" {
					t.Errorf("recv = %d %s, want 200 or 429 inflight_cap", code, body)
				}
			})
		}
		close(start)
		wg.Wait()
		if n := got.Load(); n != limit {
			t.Errorf("round %d: %d concurrent receives took %d messages, want exactly global_inflight = %d", round, receivers, n, limit)
		}
		var st stats
		_, body := call(t, h, "GET", "/v1/topics/t", "")
		if json.Unmarshal([]byte(body), &st) != nil || st.Inflight > limit {
			t.Errorf("round %d: topic counts %s, want at most %d in flight", round, body, limit)
		}
		clock.add(250 * time.Millisecond)
	}
}

func TestBatches(t *testing.T) {
	h := serve(t, definition(), plugintest.Options{Config: `max_message_bytes = 4`})
	code, body := call(t, h, "POST", "/v1/send/batch", `{"entries":[
		{"topic":"t","payload":"YQ==","idempotency_key":"k1"},
		{"topic":"t","payload":"`+b64("toolong")+`"},
		{"topic":"t","payload":"Yg==","bogus":1},
		{"topic":"t","payload":"YQ==","idempotency_key":"k1"},
		{"topic":"t","payload":"Yw=="},
		{"topic":"t","payload":"Yg==","idempotency_key":"k1"},
		{"topic":"u","payload":"Yg==","idempotency_key":"k1"}]}`)
	var sent struct {
		Results []struct {
			MsgID     string `json:"msg_id"`
			Duplicate bool
			Error     *struct {
				Status int
				Code   string
			}
		}
	}
	if code != 200 || json.Unmarshal([]byte(body), &sent) != nil || len(sent.Results) != 7 {
		t.Fatalf("send batch = %d %s", code, body)
	}
	r := sent.Results
	if r[1].Error == nil || r[1].Error.Status != 413 || r[2].Error == nil || r[2].Error.Code != "bad_request" || r[4].MsgID == "" {
		t.Errorf("send batch = %s, want entry 4 sent, 1 too large, 2 refused", body)
	}
	// Entries 0, 3 and 5 share a key on t, and each is answered as it
	// would be alone after the one before: the message, its duplicate,
	// and 422 for another payload. Entry 6 has the key on another topic.
	if r[0].MsgID == "" || r[0].Duplicate || r[3].MsgID != r[0].MsgID || !r[3].Duplicate ||
		r[5].Error == nil || r[5].Error.Status != 422 || r[5].Error.Code != "idempotency_key_reused" ||
		r[6].MsgID == "" || r[6].Duplicate || r[6].MsgID == r[0].MsgID {
		t.Errorf("send batch = %s; want entry 0 sent, 3 its duplicate, 5 idempotency_key_reused, 6 sent to u", body)
	}
	_, body = call(t, h, "POST", "/v1/recv", `{"topic":"t","max_messages":10}`)
	var got recvAnswer
	json.Unmarshal([]byte(body), &got)
	if len(got.Messages) != 2 {
		t.Fatalf("recv = %s, want the 2 messages sent", body)
	}
	m := got.Messages
	code, body = call(t, h, "POST", "/v1/ack/batch", `{"entries":[
		{"msg_id":"`+m[0].MsgID+`","receipt":"`+m[0].Receipt+`"},
		{"msg_id":"`+m[1].MsgID+`","receipt":"`+m[1].Receipt+`"},
		{"msg_id":"`+m[1].MsgID+`","receipt":"x"}]}`)
	if code != 200 || strings.Count(body, `"error"`) != 1 || !strings.Contains(body, `"code":"bad_request"`) {
		t.Errorf("ack batch = %d %s, want two acked and one refused", code, body)
	}
	if code, body := call(t, h, "POST", "/v1/ack/batch", `{"entries":[]}`); code != 400 {
		t.Errorf("empty ack batch = %d %s, want 400", code, body)
	}
	if code, body := call(t, h, "POST", "/v1/send/batch", `{"entries":[{"topic":"t","payload":"YQ=="}]}`, "Idempotency-Key", "b1"); code != 400 ||
		!strings.Contains(body, "idempotency_key") {
		t.Errorf("send batch with an Idempotency-Key header = %d %s, want 400 pointing at each entry's idempotency_key", code, body)
	}
	if code, body := call(t, h, "POST", "/v1/send/batch", `{"entries":[`+strings.Repeat(`{},`, 10)+`{}]}`); code != 400 {
		t.Errorf("send batch of 11 = %d %s, want 400", code, body)
	}
}

func TestStream(t *testing.T) {
	h := serve(t, definition(), plugintest.Options{})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	for _, p := range []string{"a", "b", "c"} {
		call(t, h, "POST", "/v1/send", `{"topic":"t","payload":"`+b64(p)+`"}`)
	}
	if code, body := call(t, h, "GET", "/v1/recv/stream?topic=t&bogus=1", ""); code != 400 {
		t.Errorf("stream with an unknown parameter = %d %s, want 400", code, body)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/v1/recv/stream?topic=t&max_inflight=2&visibility_ms=60000", nil)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := make(chan message, 10)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var m message
				if json.Unmarshal([]byte(data), &m) == nil {
					events <- m
				}
			}
		}
	}()
	next := func(what string) message {
		t.Helper()
		select {
		case m, ok := <-events:
			if !ok {
				t.Fatalf("%s: the stream ended", what)
			}
			return m
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no event within 5s", what)
		}
		return message{}
	}
	first, _ := next("first"), next("second")
	// max_inflight 2: the third waits for a settlement. The absence is
	// watched for a bounded time, longer than the stream's look interval.
	select {
	case m := <-events:
		t.Fatalf("a third delivery %s with 2 outstanding and max_inflight 2", m.MsgID)
	case <-time.After(10 * streamFull):
	}
	if code, body := call(t, h, "POST", "/v1/ack", `{"msg_id":"`+first.MsgID+`","receipt":"`+first.Receipt+`"}`); code != 200 {
		t.Fatalf("ack = %d %s", code, body)
	}
	if m := next("third, after an ack"); string(m.Payload) != "c" {
		t.Errorf("third event = %q, want c", m.Payload)
	}
}

func TestReadBody(t *testing.T) {
	big := strings.Repeat("x", maxBodyBytes)
	tests := []struct {
		name    string
		body    string
		size    int64
		wantLen int
		wantErr bool
	}{
		{"declared", "abc", 3, 3, false},
		{"unknown size", "abc", -1, 3, false},
		{"longer than declared", "abcdef", 3, 6, false},
		{"shorter than declared", "ab", 3, 0, true},
		{"at the cap", big, maxBodyBytes, maxBodyBytes, false},
		{"past the cap, declared", big + "y", maxBodyBytes + 1, maxBodyBytes + 1, false},
		{"past the cap, declared short", big + "yz", 10, maxBodyBytes + 1, false},
		{"past the cap, unknown size", big + "yz", -1, maxBodyBytes + 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readBody(nil, strings.NewReader(tt.body), tt.size)
			if (err != nil) != tt.wantErr || !tt.wantErr && (len(got) != tt.wantLen || !strings.HasPrefix(tt.body, string(got))) {
				t.Errorf("readBody(%d bytes, size %d) = %d bytes, %v; want %d bytes of it, error %v", len(tt.body), tt.size, len(got), err, tt.wantLen, tt.wantErr)
			}
		})
	}
}
