package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/plughost/plughost/sdk/store"
)

// mbClient is a client of the mailbox through whichever host is running:
// the test swaps base when it starts a new host.
type mbClient struct {
	base atomic.Pointer[string]
	http *http.Client
}

func (c *mbClient) post(path string, body any, hdr ...string) (int, []byte, error) {
	code, _, out, err := c.request("POST", path, body, hdr...)
	return code, out, err
}

// request sends body (JSON; none when nil) to the mailbox's path with the
// header pairs hdr, and returns the answer's status, header and body.
func (c *mbClient) request(method, path string, body any, hdr ...string) (int, http.Header, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, *c.base.Load()+"/mailbox"+path, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, out, err
}

// startMailbox starts a host on cfg, waits until its mailbox is ready,
// and returns a client of it.
func startMailbox(t *testing.T, cfg string) (*hostProc, *mbClient) {
	t.Helper()
	h := startHost(t, cfg)
	readyPlugin(t, h, "mailbox")
	c := &mbClient{http: &http.Client{Timeout: 10 * time.Second}}
	c.base.Store(&h.ingress)
	return h, c
}

// mbDelivery is one delivery a consumer saw: the receive's request
// started at start and was answered at end.
type mbDelivery struct {
	receipt    string
	start, end time.Time
}

// mbAck is an ack the mailbox answered 200, sent at start, answered at end.
type mbAck struct{ start, end time.Time }

// mbHistory is what the clients saw, for the checker.
type mbHistory struct {
	mu         sync.Mutex
	sent       map[string]string // payload → msg_id, sends answered 200
	deliveries map[string][]mbDelivery
	acks       map[string][]mbAck
}

// TestMailboxAtLeastOnceUnderKill9 runs producers and consumers through
// the real host while the mailbox plugin is killed with SIGKILL three
// times and the host once, then drains the topic and checks the history
// as Jepsen's total-queue and lease-queue workloads do: every
// acknowledged send was received, no message was acked twice, none was
// delivered after its ack, and no two deliveries of one message held
// unexpired visibility at once.
func TestMailboxAtLeastOnceUnderKill9(t *testing.T) {
	const (
		producers  = 4
		consumers  = 4
		perKill    = 100 // acknowledged sends between kills
		visibility = 1000 * time.Millisecond
	)
	data := filepath.Join(t.TempDir(), "data")
	cfg := strings.Replace(baseConfig("2s"), `"./data"`, strconv.Quote(data), 1) +
		pluginBlock("mailbox", "mailbox", "  config {\n    max_attempts = 1000\n  }")
	h, c := startMailbox(t, cfg)
	hist := &mbHistory{sent: map[string]string{}, deliveries: map[string][]mbDelivery{}, acks: map[string][]mbAck{}}

	var stopSend, stopRecv atomic.Bool
	var sentOK atomic.Int64
	var prodWG, wg sync.WaitGroup
	for p := range producers {
		prodWG.Go(func() {
			for n := 0; !stopSend.Load(); n++ {
				payload := fmt.Sprintf("p%d-%d", p, n)
				// Retry with the same key until answered 200, also after
				// stopSend, so that no send is left with an unknown
				// outcome: the key makes the retries one send.
				for giveUp := time.Now().Add(60 * time.Second); time.Now().Before(giveUp); {
					code, body, err := c.post("/v1/send", map[string]any{"topic": "jepsen", "payload": []byte(payload)}, "Idempotency-Key", payload)
					if err == nil && code == 200 {
						var a struct {
							MsgID string `json:"msg_id"`
						}
						if json.Unmarshal(body, &a) == nil {
							hist.mu.Lock()
							hist.sent[payload] = a.MsgID
							hist.mu.Unlock()
							sentOK.Add(1)
							break
						}
					}
					time.Sleep(20 * time.Millisecond) // back off from a refusal or a dead plugin
				}
			}
		})
	}
	for range consumers {
		wg.Go(func() {
			for !stopRecv.Load() {
				start := time.Now()
				code, body, err := c.post("/v1/recv", map[string]any{"topic": "jepsen", "max_messages": 10, "visibility_ms": visibility.Milliseconds(), "wait_ms": 200})
				end := time.Now()
				if err != nil || code != 200 {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				var r struct {
					Messages []struct {
						MsgID   string `json:"msg_id"`
						Receipt string
					}
				}
				if json.Unmarshal(body, &r) != nil {
					continue
				}
				for _, m := range r.Messages {
					hist.mu.Lock()
					hist.deliveries[m.MsgID] = append(hist.deliveries[m.MsgID], mbDelivery{m.Receipt, start, end})
					hist.mu.Unlock()
					as := time.Now()
					code, _, err := c.post("/v1/ack", map[string]string{"msg_id": m.MsgID, "receipt": m.Receipt})
					if err == nil && code == 200 {
						hist.mu.Lock()
						hist.acks[m.MsgID] = append(hist.acks[m.MsgID], mbAck{as, time.Now()})
						hist.mu.Unlock()
					}
				}
			}
		})
	}
	t.Cleanup(func() { stopSend.Store(true); stopRecv.Store(true); prodWG.Wait(); wg.Wait() })

	for kill := 1; kill <= 4; kill++ {
		want := sentOK.Load() + perKill
		waitFor(t, 60*time.Second, fmt.Sprintf("%d acknowledged sends before kill %d", want, kill), func() bool { return sentOK.Load() >= want })
		if kill < 4 {
			old := h.plugins()["mailbox"]
			if err := syscall.Kill(old.Pid, syscall.SIGKILL); err != nil {
				t.Fatalf("kill -9 mailbox (pid %d): %v", old.Pid, err)
			}
			waitFor(t, 30*time.Second, "the mailbox restarted", func() bool {
				st := h.plugins()["mailbox"]
				return st.State == "ready" && st.Pid > 0 && st.Pid != old.Pid
			})
			continue
		}
		old := h.plugins()["mailbox"]
		h.signal(syscall.SIGKILL)
		if _, ok := h.waitExit(5 * time.Second); !ok {
			t.Fatal("host still running 5s after SIGKILL")
		}
		if !waitGone(old.Pid, 5*time.Second) {
			t.Fatalf("mailbox (pid %d) still alive 5s after kill -9 of the host", old.Pid)
		}
		h = startHost(t, cfg)
		readyPlugin(t, h, "mailbox")
		c.base.Store(&h.ingress)
	}
	want := sentOK.Load() + perKill
	waitFor(t, 60*time.Second, "acknowledged sends after the host's restart", func() bool { return sentOK.Load() >= want })
	stopSend.Store(true)
	prodWG.Wait()

	// Drain: consumers go on until the topic is empty and every
	// acknowledged send was delivered.
	waitFor(t, 90*time.Second, "the topic drained", func() bool {
		code, body, err := mbGet(*c.base.Load() + "/mailbox/v1/topics/jepsen")
		if err != nil || code != 200 || !strings.HasPrefix(body, `{"ready":0,"inflight":0,"delayed":0,`) {
			return false
		}
		hist.mu.Lock()
		defer hist.mu.Unlock()
		for _, id := range hist.sent {
			if len(hist.deliveries[id]) == 0 {
				return false
			}
		}
		return true
	})
	stopRecv.Store(true)
	wg.Wait()

	hist.mu.Lock()
	defer hist.mu.Unlock()
	redelivered := 0
	for payload, id := range hist.sent {
		ds, as := hist.deliveries[id], hist.acks[id]
		if len(ds) == 0 {
			t.Errorf("acknowledged send %s (%s) was never received", payload, id)
		}
		if len(as) > 1 {
			t.Errorf("message %s acked %d times", id, len(as))
		}
		redelivered += max(0, len(ds)-1)
		for _, a := range as {
			for _, d := range ds {
				if d.start.After(a.end) {
					t.Errorf("message %s delivered by a receive started %v after its ack was answered", id, d.start.Sub(a.end))
				}
			}
		}
		// A delivery granted (before its receive's end) wholly before
		// another's receive started must have expired (no earlier than
		// its start plus visibility) before the other was granted (no
		// later than its end).
		for i := range ds {
			for j := range ds {
				if i != j && !ds[j].start.Before(ds[i].end) && ds[j].end.Before(ds[i].start.Add(visibility)) {
					t.Errorf("message %s: delivery %s (received %v–%v) overlaps the visibility of %s (received from %v)", id, ds[j].receipt,
						ds[j].start.Format(time.StampMicro), ds[j].end.Format(time.StampMicro), ds[i].receipt, ds[i].start.Format(time.StampMicro))
				}
			}
		}
	}
	for id := range hist.deliveries {
		if !containsValue(hist.sent, id) {
			// A send whose 200 was lost in a kill and never retried
			// cannot happen here (producers retry until answered), but
			// the mailbox may still hold messages nobody sent: that is a
			// phantom.
			t.Errorf("message %s delivered but never sent", id)
		}
	}
	t.Logf("%d acknowledged sends, %d redeliveries, across 3 plugin kills and 1 host kill", len(hist.sent), redelivered)
}

func containsValue(m map[string]string, v string) bool {
	for _, x := range m {
		if x == v {
			return true
		}
	}
	return false
}

func mbGet(url string) (int, string, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// The mailbox's guards through the real host and plugin binaries: a
// damaged payload, a full shard and capability tokens. Each holds in
// process too (plugins/mailbox); here the operator's path is checked:
// the store file on disk, the host's /metrics and 429s, the plugin
// binary's mint subcommand.

// mbMessages is a receive's answer.
type mbMessages struct {
	Messages []struct {
		MsgID   string `json:"msg_id"`
		Payload []byte `json:"payload"`
	} `json:"messages"`
}

// mbStats is a topic's counts.
type mbStats struct {
	Ready, Inflight, Delayed, DLQ, Damaged int
}

// mbTopic reads topic's counts through c.
func mbTopic(t *testing.T, c *mbClient, topic string, hdr ...string) mbStats {
	t.Helper()
	code, _, body, err := c.request("GET", "/v1/topics/"+topic, nil, hdr...)
	var st mbStats
	if err != nil || code != http.StatusOK || json.Unmarshal(body, &st) != nil {
		t.Fatalf("GET /v1/topics/%s = %d %s %v", topic, code, body, err)
	}
	return st
}

// mbErrorBody is the platform's error body.
type mbErrorBody struct {
	Error struct{ Code, Message string }
}

// flipStoredPayload flips the last byte of message msgID's payload in
// the store at path, which no process holds, through sdk/store: under the
// store's own checksums, as a value damaged before it was written would
// be, so that only the mailbox's BLAKE3 hash can catch it, as in
// plugins/mailbox/integrity_test.go. The buckets are the mailbox's, in
// its order (storeOpts, plugins/mailbox/queue.go); a message's envelope
// is keyed by its id and ends with its payload.
func flipStoredPayload(t *testing.T, path, msgID string) {
	t.Helper()
	key, err := hex.DecodeString(msgID)
	if err != nil {
		t.Fatalf("msg_id %q: %v", msgID, err)
	}
	db, err := store.Open(path, store.Options{Buckets: []store.Bucket{
		{Name: "envelopes", Sequential: true}, {Name: "meta", Sequential: true},
		{Name: "visible"}, {Name: "idem"}, {Name: "idem_exp", Sequential: true}}})
	if err != nil {
		t.Fatalf("open the mailbox's store: %v", err)
	}
	defer db.Close()
	if err := db.Update(func(tx *store.Tx) error {
		b := bytes.Clone(tx.Get(0, key))
		if len(b) == 0 {
			return fmt.Errorf("message %s has no envelope", msgID)
		}
		b[len(b)-1] ^= 0x01
		return tx.Put(0, key, b)
	}); err != nil {
		t.Fatalf("flip message %s's payload: %v", msgID, err)
	}
}

// TestMailboxDamagedPayload: a byte of a stored payload flipped on disk
// while the host is stopped is never delivered through the restarted
// host: each receive that meets it counts integrity_fail_total{reason=
// "hash"} on /metrics, and the max_attempts'th parks it in TOPIC.dlq as
// damaged (reason integrity: no receive reaches it), while the good
// message sent beside it is delivered intact.
func TestMailboxDamagedPayload(t *testing.T) {
	data := t.TempDir()
	cfg := withDataDir(t, baseConfig("5s"), data) + pluginBlock("mailbox", "mailbox",
		"  config {\n    max_attempts = 2\n    backoff_base = \"0s\"\n    backoff_max = \"0s\"\n  }")
	h, c := startMailbox(t, cfg)
	ids := map[string]string{} // payload → msg_id
	for _, p := range []string{"good", "bad"} {
		code, body, err := c.post("/v1/send", map[string]any{"topic": "integ", "payload": []byte(p)})
		var a struct {
			MsgID string `json:"msg_id"`
		}
		if err != nil || code != http.StatusOK || json.Unmarshal(body, &a) != nil {
			t.Fatalf("send %s = %d %s %v", p, code, body, err)
		}
		ids[p] = a.MsgID
	}
	h.signal(syscall.SIGTERM)
	if _, ok := h.waitExit(15 * time.Second); !ok {
		t.Fatal("host still running 15s after SIGTERM")
	}
	flipStoredPayload(t, filepath.Join(data, "mailbox", "mailbox.db"), ids["bad"])

	h, c = startMailbox(t, cfg)
	const fails = `integrity_fail_total{plugin="mailbox",reason="hash"}`
	good := 0
	waitFor(t, 15*time.Second, "the damaged message parked in integ.dlq", func() bool {
		code, body, err := c.post("/v1/recv", map[string]any{"topic": "integ", "max_messages": 10, "visibility_ms": 60000})
		var got mbMessages
		if err != nil || code != http.StatusOK || json.Unmarshal(body, &got) != nil {
			t.Fatalf("recv = %d %s %v", code, body, err)
		}
		for _, m := range got.Messages {
			if m.MsgID != ids["good"] || string(m.Payload) != "good" {
				t.Fatalf("recv delivered %s with payload %q; the damaged message is %s: want only %s with \"good\"", m.MsgID, m.Payload, ids["bad"], ids["good"])
			}
			good++
		}
		return mbTopic(t, c, "integ.dlq").Damaged == 1
	})
	if good != 1 {
		t.Errorf("the good message was delivered %d times, want once", good)
	}
	if v, ok := h.metric(fails); !ok || v != 2 {
		t.Errorf("%s = %v (found %v), want 2: one per receive that met it, max_attempts = 2", fails, v, ok)
	}
	if st := mbTopic(t, c, "integ"); st.DLQ != 1 || st.Ready != 0 || st.Delayed != 0 {
		t.Errorf("integ's counts = %+v, want the damaged message in its DLQ and nothing ready or delayed", st)
	}
	code, body, err := c.post("/v1/recv", map[string]any{"topic": "integ.dlq", "max_messages": 10})
	if err != nil || code != http.StatusOK || !strings.Contains(string(body), `"messages":[]`) {
		t.Errorf("recv from integ.dlq = %d %s %v, want nothing: a parked message is never delivered", code, body, err)
	}
}

// TestMailboxShardFull: with commits held at the store.commit fault
// point, a shard of capacity 2 takes two sends and answers every further
// send 429 shard_full with Retry-After through the host; its depth never
// passes 2, busy_rejections_total{endpoint="send"} counts each refusal,
// and once commits go on only the two sends were stored.
func TestMailboxShardFull(t *testing.T) {
	const capacity, refusals = 2, 5
	cfg := strings.Replace(baseConfig("5s"), `request_timeout = "5s"`, `request_timeout = "30s"`, 1) + faultsOn +
		pluginBlock("mailbox", "mailbox", fmt.Sprintf("  config {\n    ready_shards = 1\n    shard_capacity = %d\n    commit_timeout = \"30s\"\n  }", capacity))
	h, c := startMailbox(t, cfg)
	// Held until the fault is cleared below (within commit_timeout).
	setFaults(t, h, "mailbox", `{"faults":[{"point":"store.commit","delay":"25s"}]}`)
	held := make(chan int, capacity)
	for i := range capacity {
		go func() {
			code, _, _ := c.post("/v1/send", map[string]any{"topic": "full", "payload": []byte(fmt.Sprint("held-", i))})
			held <- code
		}()
	}
	const depth = `queue_depth{plugin="mailbox",queue="intake_shard_0"}`
	waitFor(t, 10*time.Second, "the shard full with its held sends", func() bool {
		v, _ := h.metric(depth)
		return v == capacity
	})
	// One at a time, so that no refusal is between its count's increment
	// and decrement when the depth is read.
	for i := range refusals {
		code, hdr, body, err := c.request("POST", "/v1/send", map[string]any{"topic": "full", "payload": []byte(fmt.Sprint("refused-", i))})
		var e mbErrorBody
		if err != nil || code != http.StatusTooManyRequests || json.Unmarshal(body, &e) != nil || e.Error.Code != "shard_full" || hdr.Get("Retry-After") == "" {
			t.Errorf("send to the full shard = %d %s (Retry-After %q) %v, want 429 shard_full with Retry-After", code, body, hdr.Get("Retry-After"), err)
		}
		if v, ok := h.metric(depth); !ok || v > capacity {
			t.Errorf("%s = %v (found %v), want at most the capacity %d", depth, v, ok, capacity)
		}
	}
	const busy = `busy_rejections_total{endpoint="send",plugin="mailbox"}`
	if v, ok := h.metric(busy); !ok || v != refusals {
		t.Errorf("%s = %v (found %v), want %d", busy, v, ok, refusals)
	}
	setFaults(t, h, "mailbox", "")
	for range capacity {
		if code := <-held; code != http.StatusOK {
			t.Errorf("a held send = %d, want 200 once commits go on", code)
		}
	}
	if st := mbTopic(t, c, "full"); st.Ready != capacity {
		t.Errorf("the topic's counts = %+v, want the %d held sends ready and nothing else", st, capacity)
	}
}

// TestMailboxCapabilities: with auth enabled, tokens minted by the plugin
// binary's `mailbox mint`, run as an operator runs it, allow exactly
// their topic and operations until their expiry; wrong topic, wrong
// operation and an expired token are answered 403 forbidden with the
// reason, no token 401.
func TestMailboxCapabilities(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "root.key")
	key := make([]byte, 32)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(key)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, c := startMailbox(t, baseConfig("5s")+pluginBlock("mailbox", "mailbox",
		fmt.Sprintf("  config {\n    auth {\n      enabled = true\n      root_key_file = %q\n    }\n  }", keyFile)))
	mint := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(bins.plugins, "mailbox"), append([]string{"mint", "-root-key-file", keyFile}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("mailbox mint %s: %v: %s", strings.Join(args, " "), err, stderr.String())
		}
		return strings.TrimSpace(string(out))
	}
	send := mint("-topic", "orders", "-ops", "send", "-ttl", "1h")
	expired := mint("-topic", "orders", "-ops", "send", "-expires", time.Now().Add(-time.Minute).UTC().Format(time.RFC3339))
	orders := map[string]any{"topic": "orders", "payload": []byte("x")}
	for _, tt := range []struct {
		name, path string
		body       map[string]any
		token      string
		code       int
		reason     string // in the error's message
	}{
		{"the allowed op", "/v1/send", orders, send, http.StatusOK, ""},
		{"wrong topic", "/v1/send", map[string]any{"topic": "payments", "payload": []byte("x")}, send, http.StatusForbidden, `for topic "orders", not "payments"`},
		{"wrong op", "/v1/recv", map[string]any{"topic": "orders"}, send, http.StatusForbidden, "allows send, not recv"},
		{"expired", "/v1/send", orders, expired, http.StatusForbidden, "expired at"},
		{"no token", "/v1/send", orders, "", http.StatusUnauthorized, "bearer capability token is required"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var hdr []string
			if tt.token != "" {
				hdr = []string{"Authorization", "Bearer " + tt.token}
			}
			code, body, err := c.post(tt.path, tt.body, hdr...)
			if err != nil || code != tt.code {
				t.Fatalf("POST %s = %d %s %v, want %d", tt.path, code, body, err, tt.code)
			}
			var e mbErrorBody
			if tt.reason != "" && (json.Unmarshal(body, &e) != nil || !strings.Contains(e.Error.Message, tt.reason)) {
				t.Errorf("POST %s = %d %s, want a message saying %q", tt.path, code, body, tt.reason)
			}
		})
	}
}

// TestMailboxLongestTopicSurvivesRestart: a message of a topic of the
// longest name, terminated into its dead-letter queue and delivered from
// there, is read back by the next process: the mailbox restarts ready,
// and the DLQ is inspected, received from and redriven through the host.
func TestMailboxLongestTopicSurvivesRestart(t *testing.T) {
	cfg := withDataDir(t, baseConfig("5s"), t.TempDir()) + pluginBlock("mailbox", "mailbox", "")
	h, c := startMailbox(t, cfg)
	topic := strings.Repeat("x", 200)
	dlq := topic + ".dlq"
	type delivered struct {
		Messages []struct {
			MsgID   string `json:"msg_id"`
			Receipt string `json:"receipt"`
		} `json:"messages"`
	}
	recv := func(tp string) (id, receipt string) {
		t.Helper()
		code, body, err := c.post("/v1/recv", map[string]any{"topic": tp, "visibility_ms": 60000})
		var got delivered
		if err != nil || code != http.StatusOK || json.Unmarshal(body, &got) != nil || len(got.Messages) != 1 {
			t.Fatalf("recv %d characters = %d %s %v, want one message", len(tp), code, body, err)
		}
		return got.Messages[0].MsgID, got.Messages[0].Receipt
	}
	if code, body, err := c.post("/v1/send", map[string]any{"topic": topic, "payload": []byte("a")}); err != nil || code != http.StatusOK {
		t.Fatalf("send to a %d-character topic = %d %s %v", len(topic), code, body, err)
	}
	id, receipt := recv(topic)
	if code, body, err := c.post("/v1/terminate", map[string]any{"msg_id": id, "receipt": receipt}); err != nil || code != http.StatusOK {
		t.Fatalf("terminate into its DLQ = %d %s %v", code, body, err)
	}
	recv(dlq) // a delivery in flight, which the next process counts at its start

	old := h.plugins()["mailbox"].Pid
	if code, body := do(t, http.MethodPost, h.admin+"/v1/plugins/mailbox/restart", nil, nil); code != http.StatusAccepted {
		t.Fatalf("POST /v1/plugins/mailbox/restart = %d %s, want 202", code, body)
	}
	waitFor(t, 15*time.Second, "the mailbox to restart ready", func() bool {
		p := h.plugins()["mailbox"]
		if p.State == "backoff" || p.State == "failed" {
			t.Fatalf("mailbox after the restart: %+v, want ready", p)
		}
		return p.State == "ready" && p.Pid != old
	})
	if st := mbTopic(t, c, dlq); st.Inflight != 1 {
		t.Errorf("the DLQ's counts after the restart = %+v, want the delivery in flight", st)
	}
	if code, body, err := c.post("/v1/redrive", map[string]any{"topic": topic, "max": 10}); err != nil || code != http.StatusAccepted {
		t.Fatalf("redrive the %d-character topic = %d %s %v, want 202", len(topic), code, body, err)
	}
	if code, body, err := c.post("/v1/send", map[string]any{"topic": topic + "x", "payload": []byte("a")}); err != nil ||
		code != http.StatusBadRequest || !strings.Contains(string(body), "want 1 to 200") {
		t.Errorf("send to a %d-character topic = %d %s %v, want 400 naming the limit", len(topic)+1, code, body, err)
	}
}

// TestPluginRelativePathsFromConfigDir: a relative path in a plugin's
// config block resolves against the config file's directory, as the
// host's own do, whatever the host's working directory: the mailbox
// reads root_key_file = "root.key" from beside config.hcl.
func TestPluginRelativePathsFromConfigDir(t *testing.T) {
	cfg := baseConfig("5s") + pluginBlock("mailbox", "mailbox", "  config {\n    auth {\n      enabled = true\n      root_key_file = \"root.key\"\n    }\n  }")
	elsewhere := t.TempDir()
	h := waitServing(t, launchHostCmd(t, cfg, func(bin string, run []string) *exec.Cmd {
		dir := filepath.Dir(run[2]) // run -config PATH
		if err := os.WriteFile(filepath.Join(dir, "root.key"), bytes.Repeat([]byte("k"), 32), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, run...)
		cmd.Dir = elsewhere
		return cmd
	}))
	readyPlugin(t, h, "mailbox")
	// Auth is on: a send without a token is 401, not served.
	code, body := do(t, http.MethodPost, h.ingress+"/mailbox/v1/send", strings.NewReader(`{"topic":"t","payload":"YQ=="}`), nil)
	if code != http.StatusUnauthorized {
		t.Errorf("send without a token = %d %s, want 401: auth on, with the key read", code, body)
	}
}
