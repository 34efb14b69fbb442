package main

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/plughost/plughost/sdk/store"
)

// flipPayloadByte flips the last byte of message id's stored payload
// under the store's checksums, as a value damaged before it was written
// would be: the store reads it back, only its BLAKE3 hash fails.
func (q *queue) flipPayloadByte(id uint64) {
	q.t.Helper()
	err := q.db.Update(func(tx *store.Tx) error {
		b := bytes.Clone(tx.Get(bucketEnvelopes, idKey(id)))
		if len(b) == 0 {
			return fmt.Errorf("message %s has no envelope", MsgID(id))
		}
		b[len(b)-1] ^= 0x01
		return tx.Put(bucketEnvelopes, idKey(id), b)
	})
	if err != nil {
		q.t.Fatal(err)
	}
}

// recvWithin applies one receive of up to 10 messages of topic, failing
// the test if its group does not finish within budget.
func (q *queue) recvWithin(topic string, budget time.Duration) result {
	q.t.Helper()
	o := op{kind: opRecv, topic: topic, max: 10, visibility: time.Second}
	type answer struct {
		out []result
		err error
	}
	done := make(chan answer, 1)
	now := q.now
	go func() {
		out, err := q.r.commit(q.db, now, []op{o})
		done <- answer{out, err}
	}()
	t := time.NewTimer(budget)
	defer t.Stop()
	select {
	case a := <-done:
		if a.err != nil {
			q.t.Fatalf("recv %q: %v", topic, a.err)
		}
		return a.out[0]
	case <-t.C:
		// The group holds the store's writer: leave the store open.
		q.hung = true
		q.t.Fatalf("recv %q did not finish within %v: its group never moves past the damaged message", topic, budget)
		return result{}
	}
}

// TestDamagedPayloadLeavesReceivableSet: a message whose stored payload
// fails its hash, in a topic or already in a DLQ, with any max_attempts,
// is never delivered, is counted at each receive that meets it, is parked
// in the DLQ after max_attempts, and never stops a receive from answering
// the good messages behind it.
func TestDamagedPayloadLeavesReceivableSet(t *testing.T) {
	for _, maxAttempts := range []uint32{1, 2, 3} {
		for _, topic := range []string{"t", "t.dlq"} {
			name := fmt.Sprintf("max_attempts=%d/%s", maxAttempts, topic)
			if !t.Run(name, func(t *testing.T) { testDamagedPayload(t, maxAttempts, topic) }) {
				return // a receive that hung still holds a CPU: stop here
			}
		}
	}
}

func testDamagedPayload(t *testing.T, maxAttempts uint32, topic string) {
	q := newQueue(t, rules{maxAttempts: maxAttempts, backoffBase: time.Second, backoffMax: time.Minute})
	start := time.Now()
	var bad uint64
	for i, p := range []string{"bad", "good-1", "good-2"} {
		id := q.send("t", p)
		if i == 0 {
			bad = id
		}
		if topic != "t" { // into the DLQ the way messages get there
			d := q.recv("t", 1, time.Second)
			if len(d) != 1 || d[0].ID != id {
				t.Fatalf("recv = %+v, want message %s", d, MsgID(id))
			}
			if err := q.settle(opTerminate, d[0], 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	q.flipPayloadByte(bad)
	// A receive of three messages does less work than the groups that put
	// them there; give it ten times theirs, and at least the default
	// commit_timeout.
	budget := max(time.Second, 10*time.Since(start))

	for i := range maxAttempts {
		res := q.recvWithin(topic, budget)
		for _, d := range res.msgs {
			if d.ID == bad {
				t.Fatalf("receive %d delivered %q, whose hash fails", i+1, d.Env.Payload)
			}
			if err := q.settle(opAck, d, 0); err != nil {
				t.Fatal(err)
			}
		}
		want := "[]"
		if i == 0 {
			want = "[good-1 good-2]"
		}
		if got := fmt.Sprint(payloads(res.msgs)); got != want || res.integ != 1 {
			t.Fatalf("receive %d = %s with %d integrity failures, want %s and 1", i+1, got, res.integ, want)
		}
		if last := i+1 == maxAttempts; res.backoffs != 1 && !last || res.backoffs != 0 && last {
			t.Fatalf("receive %d of %d put back %d after a backoff, want 1 but at the last", i+1, maxAttempts, res.backoffs)
		}
		q.now = q.now.Add(2 * time.Minute) // past any backoff
	}

	// Parked: in the DLQ with its reason, out of every receive and redrive.
	var m meta
	err := q.db.View(func(s *store.Snapshot) (err error) {
		m, err = decodeMeta(s.Get(bucketMeta, idKey(bad)))
		return err
	})
	if err != nil || m.Topic != "t.dlq" || m.Reason != "integrity" {
		t.Fatalf("meta of the damaged message = %+v, %v; want in t.dlq with reason integrity", m, err)
	}
	for _, tp := range []string{"t", "t.dlq"} {
		res := q.recvWithin(tp, budget)
		if len(res.msgs) != 0 || res.integ != 0 || res.next != 0 {
			t.Errorf("recv %q after parking = %d delivered, %d integrity failures, next %d; want nothing", tp, len(res.msgs), res.integ, res.next)
		}
	}
	if got := q.apply(op{kind: opRedrive, topic: "t", max: 10}).redriven; got != 0 {
		t.Errorf("redrive moved %d, want the parked message left in the DLQ", got)
	}
	if st := q.stats("t.dlq"); st.Ready != 0 || st.Delayed != 0 || st.Damaged != 1 {
		t.Errorf("stats(t.dlq) = %+v, want 1 damaged and nothing ready or delayed", st)
	}
	if st := q.stats("t"); st.DLQ != 1 {
		t.Errorf("stats(t) = %+v, want the parked message counted in its DLQ", st)
	}
}
