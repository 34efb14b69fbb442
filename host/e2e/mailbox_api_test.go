package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The mailbox's API semantics through the real host and plugin binaries
// (issue must-shows 2 to 5): visibility, extend and stale receipts;
// terminate, the DLQ and redrive; idempotent sends, also across a
// restart; the long poll; the stream's max_inflight. Each holds in
// process too (plugins/mailbox), with finer timing.

// mbDelivered is a delivery in a receive's answer or a stream's event.
type mbDelivered struct {
	MsgID    string `json:"msg_id"`
	Receipt  string `json:"receipt"`
	Payload  []byte `json:"payload"`
	Attempts int    `json:"attempts"`
}

// recv receives up to 10 messages of topic with the visibility and
// long-poll wait given, failing the test on anything but 200.
func (c *mbClient) recv(t *testing.T, topic string, visibility, wait time.Duration) []mbDelivered {
	t.Helper()
	code, body, err := c.post("/v1/recv", map[string]any{"topic": topic, "max_messages": 10,
		"visibility_ms": visibility.Milliseconds(), "wait_ms": wait.Milliseconds()})
	var got struct{ Messages []mbDelivered }
	if err != nil || code != http.StatusOK || json.Unmarshal(body, &got) != nil {
		t.Fatalf("recv from %s = %d %s %v", topic, code, body, err)
	}
	return got.Messages
}

// send sends payload to topic, with an Idempotency-Key if key is set, and
// returns the msg_id and whether the mailbox called it a duplicate.
func (c *mbClient) send(t *testing.T, topic, payload, key string) (string, bool) {
	t.Helper()
	var hdr []string
	if key != "" {
		hdr = []string{"Idempotency-Key", key}
	}
	code, body, err := c.post("/v1/send", map[string]any{"topic": topic, "payload": []byte(payload)}, hdr...)
	var a struct {
		MsgID     string `json:"msg_id"`
		Duplicate bool   `json:"duplicate"`
	}
	if err != nil || code != http.StatusOK || json.Unmarshal(body, &a) != nil {
		t.Fatalf("send to %s = %d %s %v", topic, code, body, err)
	}
	return a.MsgID, a.Duplicate
}

// settle posts a settlement (ack, nack, extend, terminate) of d with the
// extra fields, and returns the status and error code.
func (c *mbClient) settle(t *testing.T, op string, d mbDelivered, extra map[string]any) (int, string) {
	t.Helper()
	body := map[string]any{"msg_id": d.MsgID, "receipt": d.Receipt}
	for k, v := range extra {
		body[k] = v
	}
	code, out, err := c.post("/v1/"+op, body)
	if err != nil {
		t.Fatalf("%s of %s: %v", op, d.MsgID, err)
	}
	var e mbErrorBody
	_ = json.Unmarshal(out, &e)
	return code, e.Error.Code
}

func TestMailboxThroughHost(t *testing.T) {
	data := t.TempDir()
	cfg := withDataDir(t, strings.Replace(baseConfig("5s"), `request_timeout = "5s"`, `request_timeout = "30s"`, 1), data) +
		pluginBlock("mailbox", "mailbox", "  config {\n    backoff_base = \"0s\"\n    backoff_max = \"0s\"\n  }")
	h, c := startMailbox(t, cfg)

	t.Run("visibility, extend and a stale receipt", func(t *testing.T) {
		id, _ := c.send(t, "vis", "v", "")
		first := c.recv(t, "vis", 250*time.Millisecond, 0)
		if len(first) != 1 || first[0].MsgID != id || first[0].Attempts != 1 {
			t.Fatalf("recv = %+v, want %s on its first attempt", first, id)
		}
		// Unacked, it comes back once its visibility ends: a long poll
		// returns it.
		again := c.recv(t, "vis", time.Minute, 10*time.Second)
		if len(again) != 1 || again[0].MsgID != id || again[0].Attempts != 2 || again[0].Receipt == first[0].Receipt {
			t.Fatalf("recv after the visibility ended = %+v, want %s again, attempt 2, a new receipt", again, id)
		}
		if code, ec := c.settle(t, "ack", first[0], nil); code != http.StatusConflict {
			t.Errorf("ack with the first delivery's receipt = %d %s, want 409", code, ec)
		}
		if code, ec := c.settle(t, "extend", again[0], map[string]any{"visibility_ms": 60000}); code != http.StatusOK {
			t.Errorf("extend = %d %s, want 200", code, ec)
		}
		if st := mbTopic(t, c, "vis"); st.Inflight != 1 || st.Ready != 0 {
			t.Errorf("vis's counts after the extend = %+v, want the message in flight, none ready", st)
		}
		if code, ec := c.settle(t, "ack", again[0], nil); code != http.StatusOK {
			t.Errorf("ack with the current receipt = %d %s, want 200", code, ec)
		}
		if got := c.recv(t, "vis", time.Second, 0); len(got) != 0 {
			t.Errorf("recv after the ack = %+v, want nothing: an acked message is never delivered again", got)
		}
	})

	t.Run("terminate, the DLQ and redrive", func(t *testing.T) {
		id, _ := c.send(t, "dl", "d", "")
		got := c.recv(t, "dl", time.Minute, 0)
		if len(got) != 1 {
			t.Fatalf("recv = %+v, want one message", got)
		}
		if code, ec := c.settle(t, "terminate", got[0], nil); code != http.StatusOK {
			t.Fatalf("terminate = %d %s, want 200", code, ec)
		}
		if st := mbTopic(t, c, "dl"); st.DLQ != 1 || st.Ready+st.Inflight != 0 {
			t.Fatalf("dl's counts after terminate = %+v, want the message in the DLQ", st)
		}
		if dlq := c.recv(t, "dl.dlq", time.Second, 0); len(dlq) != 1 || dlq[0].MsgID != id {
			t.Fatalf("recv from dl.dlq = %+v, want %s", dlq, id)
		} else if code, ec := c.settle(t, "nack", dlq[0], nil); code != http.StatusOK {
			t.Fatalf("nack in dl.dlq = %d %s, want 200", code, ec)
		}
		if code, body, err := c.post("/v1/redrive", map[string]any{"topic": "dl", "max": 10, "rate_per_s": 100}); err != nil || code != http.StatusAccepted {
			t.Fatalf("redrive = %d %s %v, want 202", code, body, err)
		}
		var back []mbDelivered
		waitFor(t, 15*time.Second, "the redriven message back in dl", func() bool {
			back = c.recv(t, "dl", time.Minute, 0)
			return len(back) > 0
		})
		if back[0].MsgID != id || back[0].Attempts != 1 {
			t.Errorf("redriven = %+v, want %s with its attempts reset", back[0], id)
		}
	})

	t.Run("long poll and stream", func(t *testing.T) {
		// A long poll waiting on an empty topic returns with the message
		// a send makes visible, long before its wait ends.
		polled := make(chan []mbDelivered, 1)
		go func() {
			code, body, err := c.post("/v1/recv", map[string]any{"topic": "lp", "max_messages": 10, "visibility_ms": 60000, "wait_ms": 20000})
			var got struct{ Messages []mbDelivered }
			if err != nil || code != http.StatusOK || json.Unmarshal(body, &got) != nil {
				t.Errorf("long poll = %d %s %v", code, body, err)
			}
			polled <- got.Messages
		}()
		waitFor(t, 10*time.Second, "the long poll waiting", func() bool {
			v, _ := h.metric(`plughost_inflight_requests{plugin="mailbox"}`)
			return v >= 1
		})
		sent := time.Now()
		id, _ := c.send(t, "lp", "p", "")
		if got := <-polled; len(got) != 1 || got[0].MsgID != id {
			t.Errorf("long poll = %+v, want %s", got, id)
		} else if waited := time.Since(sent); waited >= 20*time.Second {
			t.Errorf("long poll answered %v after the send, at the end of its wait", waited)
		}

		// The stream holds at most max_inflight deliveries unsettled.
		for i := range 4 {
			c.send(t, "st", fmt.Sprint("s", i), "")
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", h.ingress+"/mailbox/v1/recv/stream?topic=st&max_inflight=2&visibility_ms=60000", nil)
		resp, err := (&http.Client{}).Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("stream = %v %v", resp, err)
		}
		defer resp.Body.Close()
		events := make(chan mbDelivered, 8)
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		wg.Go(func() {
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				var d mbDelivered
				if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && json.Unmarshal([]byte(data), &d) == nil && d.MsgID != "" {
					events <- d
				}
			}
		})
		next := func(what string) mbDelivered {
			t.Helper()
			select {
			case d := <-events:
				return d
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: no event within 10s", what)
			}
			return mbDelivered{}
		}
		first, _ := next("first"), next("second")
		if st := mbTopic(t, c, "st"); st.Inflight != 2 || st.Ready != 2 {
			t.Errorf("st's counts with the stream holding 2 = %+v, want 2 in flight and 2 ready", st)
		}
		if code, ec := c.settle(t, "ack", first, nil); code != http.StatusOK {
			t.Fatalf("ack = %d %s", code, ec)
		}
		next("third, after an ack")
		if st := mbTopic(t, c, "st"); st.Inflight > 2 {
			t.Errorf("st's counts = %+v, want at most max_inflight 2 in flight", st)
		}
	})

	t.Run("idempotent sends, also after a restart", func(t *testing.T) {
		// Each answer is the message (200, the first fresh, the others
		// duplicates) or 409 idempotency_key_in_use while the first is
		// being committed; together they make one message.
		const n = 8
		type answer struct {
			code        int
			errCode, id string
			duplicate   bool
		}
		answers := make([]answer, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				code, body, err := c.post("/v1/send", map[string]any{"topic": "idem", "payload": []byte("once")}, "Idempotency-Key", "key-1")
				var a struct {
					MsgID     string `json:"msg_id"`
					Duplicate bool   `json:"duplicate"`
					Error     struct{ Code string }
				}
				if err != nil || json.Unmarshal(body, &a) != nil {
					t.Errorf("send %d with the key: %d %s %v", i, code, body, err)
				}
				answers[i] = answer{code, a.Error.Code, a.MsgID, a.Duplicate}
			})
		}
		wg.Wait()
		var original string
		fresh := 0
		for i, a := range answers {
			switch {
			case a.code == http.StatusOK && !a.duplicate:
				fresh++
				original = a.id
			case a.code == http.StatusOK, a.code == http.StatusConflict && a.errCode == "idempotency_key_in_use":
			default:
				t.Errorf("send %d with the key = %+v, want 200 or 409 idempotency_key_in_use", i, a)
			}
		}
		for i, a := range answers {
			if a.code == http.StatusOK && a.id != original {
				t.Errorf("send %d with the key = %s, want the one message %s", i, a.id, original)
			}
		}
		if st := mbTopic(t, c, "idem"); fresh != 1 || st.Ready != 1 {
			t.Fatalf("%d concurrent sends with one key: %d fresh, %d ready; want one message", n, fresh, st.Ready)
		}
		h.signal(syscall.SIGTERM)
		if _, ok := h.waitExit(15 * time.Second); !ok {
			t.Fatal("host still running 15s after SIGTERM")
		}
		_, c2 := startMailbox(t, cfg)
		if id, dup := c2.send(t, "idem", "once", "key-1"); id != original || !dup {
			t.Errorf("the key after a restart = %s (duplicate %t), want the original %s as a duplicate", id, dup, original)
		}
	})
}
