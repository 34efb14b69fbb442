package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/sdk/idem"
	"github.com/plughost/plughost/sdk/store"
)

// queue is the mailbox's rules over a real store, on a clock the test
// moves: no committer, no HTTP, no sleeps.
type queue struct {
	t   *testing.T
	db  *store.DB
	r   rules
	now time.Time
	// hung is set when a group did not finish: Close would wait for it.
	hung bool
}

func newQueue(t *testing.T, r rules) *queue {
	t.Helper()
	db, err := store.Open(filepath.Join(t.TempDir(), storeFile), storeOpts)
	if err != nil {
		t.Fatal(err)
	}
	q := &queue{t: t, db: db, now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	t.Cleanup(func() {
		if !q.hung {
			db.Close()
		}
	})
	if r.maxAttempts == 0 {
		r.maxAttempts = 5
	}
	if r.dedup == 0 {
		r.dedup = 5 * time.Minute
	}
	if r.jitter == nil {
		r.jitter = func(n int64) int64 { return n - 1 } // the top of the window
	}
	if r.floors == nil {
		r.floors = &floors{}
	}
	q.r = r
	return q
}

func (q *queue) apply(o op) result {
	q.t.Helper()
	out, err := q.r.commit(q.db, q.now, []op{o})
	if err != nil {
		q.t.Fatalf("apply %s: %v", o.kind, err)
	}
	return out[0]
}

func (q *queue) send(topic, payload string) uint64 {
	q.t.Helper()
	res := q.apply(sendOp(topic, payload, "", 0))
	if res.err != nil {
		q.t.Fatalf("send: %v", res.err)
	}
	return res.id
}

func sendOp(topic, payload, key string, delay time.Duration) op {
	p := []byte(payload)
	return op{kind: opSend, topic: topic, key: key, delay: delay,
		fp: idem.FingerprintOf([]byte(topic), p), env: envelope{Hash: HashOf(p), Payload: p}}
}

func (q *queue) recv(topic string, n int, vis time.Duration) []delivery {
	q.t.Helper()
	return q.apply(op{kind: opRecv, topic: topic, max: n, visibility: vis}).msgs
}

func (q *queue) settle(kind opKind, d delivery, dur time.Duration) error {
	q.t.Helper()
	return q.apply(op{kind: kind, id: d.ID, nonce: d.Receipt, dur: dur}).err
}

func (q *queue) stats(topic string) stats {
	q.t.Helper()
	var st stats
	if err := q.db.View(func(s *store.Snapshot) (err error) {
		st, err = topicStats(s, topic, q.now)
		return err
	}); err != nil {
		q.t.Fatal(err)
	}
	return st
}

func payloads(ds []delivery) []string {
	var out []string
	for _, d := range ds {
		out = append(out, string(d.Env.Payload))
	}
	return out
}

func TestDeliveryCycle(t *testing.T) {
	q := newQueue(t, rules{})
	q.send("t", "a")
	first := q.recv("t", 10, time.Second)
	if got := payloads(first); len(got) != 1 || got[0] != "a" || first[0].Attempts != 1 {
		t.Fatalf("recv = %v, want a, attempts 1", first)
	}
	if got := q.recv("t", 10, time.Second); len(got) != 0 {
		t.Fatalf("recv while in flight = %v, want nothing", payloads(got))
	}
	if st := q.stats("t"); st != (stats{Inflight: 1}) {
		t.Errorf("stats in flight = %+v, want 1 in flight", st)
	}
	// One millisecond before the deadline the delivery still holds it;
	// at the deadline it is visible again.
	q.now = q.now.Add(time.Second - time.Millisecond)
	if got := q.recv("t", 10, time.Second); len(got) != 0 {
		t.Fatalf("recv 1ms before the deadline = %v, want nothing", payloads(got))
	}
	q.now = q.now.Add(time.Millisecond)
	second := q.recv("t", 10, time.Second)
	if len(second) != 1 || second[0].Attempts != 2 || second[0].ID != first[0].ID {
		t.Fatalf("recv at the deadline = %+v, want the message again, attempts 2", second)
	}
	if err := q.settle(opAck, first[0], 0); !errors.Is(err, ErrStaleReceipt) {
		t.Errorf("ack with the first delivery's receipt = %v, want ErrStaleReceipt", err)
	}
	if err := q.settle(opAck, second[0], 0); err != nil {
		t.Fatalf("ack = %v", err)
	}
	if err := q.settle(opAck, second[0], 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("second ack = %v, want ErrNotFound", err)
	}
	q.now = q.now.Add(time.Hour)
	if got := q.recv("t", 10, time.Second); len(got) != 0 {
		t.Errorf("recv after ack = %v, want nothing ever again", payloads(got))
	}
	if st := q.stats("t"); st != (stats{}) {
		t.Errorf("stats after ack = %+v, want empty", st)
	}
}

func TestFIFOAndBatch(t *testing.T) {
	q := newQueue(t, rules{})
	for i := range 12 {
		q.send("t", fmt.Sprint(i))
		q.send("other", "x")
	}
	got := payloads(q.recv("t", 10, time.Second))
	want := []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("recv 10 = %v, want %v", got, want)
	}
	if got := payloads(q.recv("t", 10, time.Second)); fmt.Sprint(got) != "[10 11]" {
		t.Errorf("recv the rest = %v, want [10 11]", got)
	}
}

func TestDelay(t *testing.T) {
	q := newQueue(t, rules{})
	q.apply(sendOp("t", "later", "", 2*time.Second))
	if st := q.stats("t"); st != (stats{Delayed: 1}) {
		t.Errorf("stats = %+v, want 1 delayed", st)
	}
	q.now = q.now.Add(2*time.Second - time.Millisecond)
	if got := q.recv("t", 1, time.Second); len(got) != 0 {
		t.Fatalf("recv before the delay = %v, want nothing", payloads(got))
	}
	q.now = q.now.Add(time.Millisecond)
	if got := q.recv("t", 1, time.Second); len(got) != 1 {
		t.Fatalf("recv after the delay = %v, want the message", payloads(got))
	}
}

func TestNextDeadline(t *testing.T) {
	q := newQueue(t, rules{})
	q.apply(sendOp("t", "later", "", 3*time.Second))
	res := q.apply(op{kind: opRecv, topic: "t", max: 1, visibility: time.Second})
	if want := q.now.Add(3 * time.Second).UnixMilli(); res.next != want {
		t.Errorf("next = %d, want %d (the delayed message's)", res.next, want)
	}
}

func TestExtend(t *testing.T) {
	q := newQueue(t, rules{})
	q.send("t", "a")
	d := q.recv("t", 1, time.Second)[0]
	q.now = q.now.Add(900 * time.Millisecond)
	if err := q.settle(opExtend, d, 5*time.Second); err != nil {
		t.Fatalf("extend = %v", err)
	}
	q.now = q.now.Add(5*time.Second - time.Millisecond)
	if got := q.recv("t", 1, time.Second); len(got) != 0 {
		t.Fatalf("recv inside the extension = %v, want nothing", payloads(got))
	}
	q.now = q.now.Add(time.Millisecond)
	if err := q.settle(opExtend, d, 5*time.Second); !errors.Is(err, ErrExpired) {
		t.Errorf("extend at the deadline = %v, want ErrExpired", err)
	}
	if err := q.settle(opAck, d, 0); err != nil {
		t.Errorf("ack of the expired delivery nobody took since = %v, want it accepted", err)
	}
}

func TestNack(t *testing.T) {
	q := newQueue(t, rules{backoffBase: 200 * time.Millisecond, backoffMax: time.Second})
	q.send("t", "a")
	d := q.recv("t", 1, time.Minute)[0]
	if res := q.apply(op{kind: opNack, id: d.ID, nonce: d.Receipt, dur: 500 * time.Millisecond}); res.err != nil || res.backoffs != 0 {
		t.Fatalf("nack with delay_ms = %v with %d backoffs, want nil with none", res.err, res.backoffs)
	}
	if err := q.settle(opAck, d, 0); !errors.Is(err, ErrStaleReceipt) {
		t.Errorf("ack after nack = %v, want ErrStaleReceipt", err)
	}
	q.now = q.now.Add(499 * time.Millisecond)
	if got := q.recv("t", 1, time.Minute); len(got) != 0 {
		t.Fatalf("recv before nack's delay = %v, want nothing", payloads(got))
	}
	q.now = q.now.Add(time.Millisecond)
	d = q.recv("t", 1, time.Minute)[0]
	// Without delay_ms: full jitter up to base·2^(attempts−1), here the
	// top of [0, 400ms) as the test's jitter draws. It is a backoff, for
	// requeue_backoff_total; a nack with delay_ms was not.
	res := q.apply(op{kind: opNack, id: d.ID, nonce: d.Receipt, dur: -1})
	if res.err != nil || res.backoffs != 1 {
		t.Fatalf("nack without delay_ms = %v with %d backoffs, want nil with 1", res.err, res.backoffs)
	}
	q.now = q.now.Add(398 * time.Millisecond)
	if got := q.recv("t", 1, time.Minute); len(got) != 0 {
		t.Fatalf("recv inside the backoff = %v, want nothing", payloads(got))
	}
	q.now = q.now.Add(time.Millisecond)
	if got := q.recv("t", 1, time.Minute); len(got) != 1 {
		t.Fatalf("recv after the backoff = %v, want the message", payloads(got))
	}
}

func TestBackoff(t *testing.T) {
	r := rules{backoffBase: 200 * time.Millisecond, backoffMax: time.Second, jitter: func(n int64) int64 { return n - 1 }}
	for _, tt := range []struct {
		attempts uint32
		want     time.Duration
	}{{1, 200*time.Millisecond - 1}, {2, 400*time.Millisecond - 1}, {3, 800*time.Millisecond - 1}, {4, time.Second - 1}, {40, time.Second - 1}} {
		if got := r.backoff(tt.attempts); got != tt.want {
			t.Errorf("backoff(%d) = %v, want %v", tt.attempts, got, tt.want)
		}
	}
}

func TestDeadLetters(t *testing.T) {
	q := newQueue(t, rules{maxAttempts: 2})
	q.send("t", "a")
	for i := range 2 {
		if got := q.recv("t", 1, time.Second); len(got) != 1 {
			t.Fatalf("delivery %d = %v, want the message", i+1, payloads(got))
		}
		q.now = q.now.Add(time.Second)
	}
	res := q.apply(op{kind: opRecv, topic: "t", max: 1, visibility: time.Second})
	if len(res.msgs) != 0 || res.dlq != 1 {
		t.Fatalf("third recv with max_attempts 2 = %v, dlq %d; want nothing delivered, one moved", payloads(res.msgs), res.dlq)
	}
	if st := q.stats("t"); st != (stats{DLQ: 1}) {
		t.Errorf("stats = %+v, want 1 in the DLQ", st)
	}
	// The DLQ is a topic; its messages never move on.
	for range 3 {
		d := q.recv("t.dlq", 1, time.Second)
		if len(d) != 1 {
			t.Fatalf("recv t.dlq = %v, want the message", payloads(d))
		}
		q.now = q.now.Add(time.Second)
	}
	if got := q.apply(op{kind: opRedrive, topic: "t", max: 10}).redriven; got != 1 {
		t.Fatalf("redrive moved %d, want 1", got)
	}
	d := q.recv("t", 1, time.Second)
	if len(d) != 1 || d[0].Attempts != 1 {
		t.Fatalf("recv after redrive = %+v, want the message with attempts reset", d)
	}
	if err := q.settle(opTerminate, d[0], 0); err != nil {
		t.Fatal(err)
	}
	if st := q.stats("t"); st != (stats{DLQ: 1}) {
		t.Errorf("stats after terminate = %+v, want 1 in the DLQ", st)
	}
}

func TestIntegrity(t *testing.T) {
	q := newQueue(t, rules{maxAttempts: 3})
	bad := sendOp("t", "good", "", 0)
	bad.env.Payload = []byte("evil") // stored with the hash of another payload
	q.apply(bad)
	integ := 0
	for range 3 {
		res := q.apply(op{kind: opRecv, topic: "t", max: 1, visibility: time.Second})
		if len(res.msgs) != 0 {
			t.Fatalf("recv delivered %q, whose hash fails", payloads(res.msgs))
		}
		integ += res.integ
		q.now = q.now.Add(time.Minute)
	}
	if integ != 3 {
		t.Errorf("integrity failures = %d, want 3", integ)
	}
	if st := q.stats("t"); st.DLQ != 1 {
		t.Errorf("stats = %+v, want the message in the DLQ after max_attempts", st)
	}
}

func TestIdempotentSend(t *testing.T) {
	q := newQueue(t, rules{dedup: time.Minute})
	first := q.apply(sendOp("t", "a", "k", 0))
	again := q.apply(sendOp("t", "a", "k", 0))
	if !again.duplicate || again.id != first.id {
		t.Fatalf("resend = %+v, want duplicate of %d", again, first.id)
	}
	if res := q.apply(sendOp("t", "b", "k", 0)); !errors.Is(res.err, idem.ErrReused) {
		t.Errorf("same key, other payload = %v, want ErrReused", res.err)
	}
	if res := q.apply(sendOp("u", "a", "k", 0)); res.duplicate || res.id == first.id {
		t.Errorf("same key, other topic = %+v, want a new message", res)
	}
	d := q.recv("t", 1, time.Second)[0]
	if err := q.settle(opAck, d, 0); err != nil {
		t.Fatal(err)
	}
	q.now = q.now.Add(time.Minute - time.Millisecond)
	if res := q.apply(sendOp("t", "a", "k", 0)); !res.duplicate || res.id != first.id {
		t.Errorf("resend after ack, inside the window = %+v, want the duplicate", res)
	}
	q.now = q.now.Add(time.Millisecond)
	if res := q.apply(sendOp("t", "a", "k", 0)); res.duplicate {
		t.Errorf("resend at the window's end = %+v, want a new message", res)
	}
}

func TestEnvelopeRoundTrip(t *testing.T) {
	e := envelope{Hash: HashOf([]byte("p")), EnqueuedAt: 1234, Attrs: map[string]string{"b": "2", "a": ""}, Payload: []byte("p")}
	got, err := decodeEnvelope(encodeEnvelope(e))
	if err != nil || fmt.Sprint(got) != fmt.Sprint(e) {
		t.Errorf("decodeEnvelope(encodeEnvelope(%v)) = %v, %v", e, got, err)
	}
	m := meta{Topic: "t.dlq", VisibleAt: 99, Attempts: 3, Receipt: 7, Reason: "integrity"}
	if got, err := decodeMeta(encodeMeta(m)); err != nil || got != m {
		t.Errorf("decodeMeta(encodeMeta(%v)) = %v, %v", m, got, err)
	}
}

func TestReceiptRoundTrip(t *testing.T) {
	id, nonce, err := ParseReceipt(Receipt(5, 9))
	if err != nil || id != 5 || nonce != 9 {
		t.Errorf("ParseReceipt(Receipt(5, 9)) = %d, %d, %v", id, nonce, err)
	}
	for _, s := range []string{"", "0000000000000005", "0000000000000005.", "0000000000000000.0000000000000001", "000000000000000g.0000000000000001", "+000000000000005.0000000000000001"} {
		if _, _, err := ParseReceipt(s); err == nil {
			t.Errorf("ParseReceipt(%q) succeeded, want an error", s)
		}
	}
}

// TestFlippedPayloadByte flips one byte of a stored payload in every
// file that holds it (the bbolt file and any log generation still
// holding the send) and checks that the message is never delivered:
// the store's checksums refuse the read, or Open refuses the files.
func TestFlippedPayloadByte(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, storeFile)
	marker := []byte("payload-marker-0123456789abcdef")
	db, err := store.Open(path, storeOpts)
	if err != nil {
		t.Fatal(err)
	}
	r := rules{maxAttempts: 5, dedup: time.Minute}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	o := sendOp("t", string(marker), "", 0)
	if err := db.Update(func(tx *store.Tx) error { _, err := r.apply(tx, now, []op{o}); return err }); err != nil {
		t.Fatal(err)
	}
	if err := db.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	flipped := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i := bytes.Index(b, marker); i >= 0; i = bytes.Index(b, marker) {
			b[i+len(marker)/2] ^= 0x01
			flipped++
		}
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if flipped == 0 {
		t.Fatal("the payload is in no file: the test would prove nothing")
	}
	db, err = store.Open(path, storeOpts)
	if err != nil {
		t.Logf("Open refused the damaged files: %v", err)
		return
	}
	defer db.Close()
	var res []result
	err = db.Update(func(tx *store.Tx) (err error) {
		res, err = r.apply(tx, now, []op{{kind: opRecv, topic: "t", max: 1, visibility: time.Second}})
		return err
	})
	if err == nil && len(res[0].msgs) > 0 {
		t.Fatalf("recv delivered %q from a damaged store, want an error or nothing", res[0].msgs[0].Env.Payload)
	}
	t.Logf("recv after %d flips: %v, %d delivered", flipped, err, func() int {
		if err != nil {
			return 0
		}
		return len(res[0].msgs)
	}())
}

func TestRetention(t *testing.T) {
	q := newQueue(t, rules{retention: time.Hour})
	q.send("t", "old")
	q.now = q.now.Add(time.Minute)
	q.send("t", "young")
	held := q.recv("t", 1, 24*time.Hour) // "old", in flight when it expires
	if len(held) != 1 {
		t.Fatal("recv found nothing")
	}
	q.now = q.now.Add(time.Hour - time.Minute - time.Millisecond)
	if res := q.apply(op{kind: opSweep, max: 10}); res.expired != 0 {
		t.Fatalf("sweep 1ms before retention deleted %d", res.expired)
	}
	q.now = q.now.Add(time.Millisecond)
	res := q.apply(op{kind: opSweep, max: 10})
	if res.expired != 1 || len(res.held) != 1 {
		t.Fatalf("sweep at retention = %+v, want old deleted and its delivery ended", res)
	}
	if err := q.settle(opAck, held[0], 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("ack of an expired message = %v, want ErrNotFound", err)
	}
	if got := payloads(q.recv("t", 10, time.Second)); fmt.Sprint(got) != "[young]" {
		t.Errorf("recv after the sweep = %v, want [young]", got)
	}
}

// TestIntegrityOneAttemptPerReceive: with a backoff that draws 0, a
// payload failing its hash still costs one attempt per receive, not
// max_attempts in one.
func TestIntegrityOneAttemptPerReceive(t *testing.T) {
	q := newQueue(t, rules{maxAttempts: 3, jitter: func(int64) int64 { return 0 }})
	bad := sendOp("t", "good", "", 0)
	bad.env.Payload = []byte("evil")
	q.apply(bad)
	if res := q.apply(op{kind: opRecv, topic: "t", max: 1, visibility: time.Second}); res.integ != 1 || res.dlq != 0 {
		t.Errorf("first receive: %d integrity failures, %d to the DLQ; want 1 and 0", res.integ, res.dlq)
	}
}

// TestHashOfVectors pins HashOf to BLAKE3-256 as the official test
// vectors give it (github.com/BLAKE3-team/BLAKE3, test_vectors.json: the
// input is bytes 0, 1, ..., 250, 0, 1, ... of each length, and the
// digest is the first 32 bytes of the extended output): stored hashes
// and clients' payload_hash are verified against it, so its digests must
// never change, whatever implementation computes them. The lengths
// cross a chunk (1024 bytes) and the batches the assembly hashes at once.
func TestHashOfVectors(t *testing.T) {
	for _, v := range []struct {
		n    int
		hash string
	}{
		{0, "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"},
		{1, "2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213"},
		{1023, "10108970eeda3eb932baac1428c7a2163b0e924c9a9e25b35bba72b28f70bd11"},
		{1024, "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7"},
		{1025, "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444"},
		{2048, "e776b6028c7cd22a4d0ba182a8bf62205d2ef576467e838ed6f2529b85fba24a"},
		{2049, "5f4d72f40d7a5f82b15ca2b2e44b1de3c2ef86c426c95c1af0b6879522563030"},
		{3072, "b98cb0ff3623be03326b373de6b9095218513e64f1ee2edd2525c7ad1e5cffd2"},
		{4096, "015094013f57a5277b59d8475c0501042c0b642e531b0a1c8f58d2163229e969"},
		{8193, "bab6c09cb8ce8cf459261398d2e7aef35700bf488116ceb94a36d0f5f1b7bc3b"},
		{16384, "f875d6646de28985646f34ee13be9a576fd515f76b5b0a26bb324735041ddde4"},
		{31744, "62b6960e1a44bcc1eb1a611a8d6235b6b4b78f32e7abc4fb4c6cdcce94895c47"},
		{100000, "d93c23eedaf165a7e0be908ba86f1a7a520d568d2d13cde787c8580c5c72cc54"},
	} {
		p := make([]byte, v.n)
		for i := range p {
			p[i] = byte(i % 251)
		}
		if got := hexHash(HashOf(p)); got != v.hash {
			t.Errorf("HashOf(%d bytes) = %s, want %s", v.n, got, v.hash)
		}
	}
}

// TestLongestTopicDeadLetters: the dead-letter queue of a topic of the
// longest name is itself a topic: its message is stored, counted,
// received, settled and redriven, and what a restart reads of it (the
// deliveries in flight) decodes.
func TestLongestTopicDeadLetters(t *testing.T) {
	topic := strings.Repeat("x", maxTopicLen)
	dlq := topic + dlqSuffix
	for _, tt := range []struct {
		name string
		ok   bool
	}{
		{topic, true}, {dlq, true}, {"", false}, {topic + "x", false},
		{topic + "xdlq", false}, // as long as a DLQ, not one
		{dlq + dlqSuffix, false}, {"x" + dlq, false},
	} {
		if got := validTopic(tt.name); got != tt.ok {
			t.Errorf("validTopic(%d characters ending %q) = %t, want %t", len(tt.name), tt.name[max(0, len(tt.name)-5):], got, tt.ok)
		}
	}

	q := newQueue(t, rules{maxAttempts: 2})
	q.send(topic, "a")
	d := q.recv(topic, 1, time.Second)
	if len(d) != 1 {
		t.Fatalf("recv = %v, want the message", payloads(d))
	}
	if err := q.settle(opTerminate, d[0], 0); err != nil {
		t.Fatalf("terminate into the DLQ of a %d-character topic: %v", len(topic), err)
	}
	if st := q.stats(topic); st != (stats{DLQ: 1}) {
		t.Errorf("stats(topic) = %+v, want 1 in the DLQ", st)
	}
	d = q.recv(dlq, 1, time.Minute)
	if len(d) != 1 {
		t.Fatalf("recv of the DLQ = %v, want the message", payloads(d))
	}
	var hs []hold
	if err := q.db.View(func(s *store.Snapshot) (err error) {
		hs, err = holds(s, q.now)
		return err
	}); err != nil || len(hs) != 1 {
		t.Fatalf("holds after a delivery from the DLQ = %v, %v; want the one delivery", hs, err)
	}
	if err := q.settle(opNack, d[0], 0); err != nil {
		t.Fatalf("nack in the DLQ: %v", err)
	}
	if got := q.apply(op{kind: opRedrive, topic: topic, max: 10}).redriven; got != 1 {
		t.Fatalf("redrive moved %d, want 1", got)
	}
	if d := q.recv(topic, 1, time.Second); len(d) != 1 {
		t.Fatalf("recv after redrive = %v, want the message", payloads(d))
	}
}

// TestDamagedMetaFailsItsOwnSettle: a settle of a message whose meta does
// not decode answers storage_corrupt for that message alone; the group's
// other operations commit.
func TestDamagedMetaFailsItsOwnSettle(t *testing.T) {
	q := newQueue(t, rules{})
	bad := q.send("t", "a")
	q.send("t", "b")
	if err := q.db.Update(func(tx *store.Tx) error { return tx.Put(bucketMeta, idKey(bad), []byte{0xff}) }); err != nil {
		t.Fatal(err)
	}
	out, err := q.r.commit(q.db, q.now, []op{
		{kind: opAck, id: bad, nonce: 1},
		sendOp("t", "c", "", 0),
	})
	if err != nil {
		t.Fatalf("group with an ack of a damaged message = %v, want its other operations committed", err)
	}
	var ce *store.CorruptError
	if !errors.As(out[0].err, &ce) || !strings.Contains(ce.Where, MsgID(bad)) {
		t.Errorf("ack of the damaged message = %v, want a CorruptError naming it", out[0].err)
	}
	if status, code := statusOf(out[0].err); status != 500 || code != "storage_corrupt" {
		t.Errorf("statusOf(ack of the damaged message) = %d %s, want 500 storage_corrupt", status, code)
	}
	if out[1].err != nil || out[1].id == 0 {
		t.Errorf("send in the same group = %+v, want committed", out[1])
	}
}
