package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/plughost/plughost/sdk/store"
	"github.com/plughost/plughost/sdk/store/storetest"
)

// TestCrash runs the store's crash suite against the mailbox's layout:
// group i sends message i with key k-i and, for odd i, receives the
// oldest ready message, so that copies taken at random moments (as kill
// -9 leaves the files, checkpoints running back to back) hold envelopes,
// meta, the visibility index and idempotency records of a prefix of the
// groups, consistent with each other.
func TestCrash(t *testing.T) {
	r := rules{maxAttempts: 5, dedup: time.Hour, jitter: func(n int64) int64 { return 0 }}
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(i int) time.Time { return base.Add(time.Duration(i) * time.Millisecond) }
	storetest.Crash(t, storeOpts, 8,
		func(tx *store.Tx, i int) error {
			ops := []op{sendOp("c", fmt.Sprint(i), fmt.Sprintf("k-%d", i), 0)}
			if i%2 == 1 {
				ops = append(ops, op{kind: opRecv, topic: "c", max: 1, visibility: time.Hour})
			}
			_, err := r.apply(tx, at(i), ops)
			return err
		},
		func(s *store.Snapshot, acked int) error {
			n := 0
			s.Ascend(bucketEnvelopes, nil, nil, func(_, _ []byte) bool { n++; return true })
			if n != acked && n != acked+1 {
				return fmt.Errorf("%d messages, want %d acknowledged (or one more, committing)", n, acked)
			}
			st, err := topicStats(s, "c", at(n))
			if err != nil {
				return err
			}
			if want := (stats{Ready: n - n/2, Inflight: n / 2}); st.Ready != want.Ready || st.Inflight != want.Inflight {
				return fmt.Errorf("after %d groups: stats %+v, want %+v", n, st, want)
			}
			for i := range n {
				rec, ok, err := r.table().Lookup(s, idemKey("c", fmt.Sprintf("k-%d", i)), at(n))
				if err != nil || !ok {
					return fmt.Errorf("key k-%d: %v, found %v", i, err, ok)
				}
				id, err := ParseMsgID(string(rec.Body))
				if err != nil {
					return err
				}
				e, err := decodeEnvelope(s.Get(bucketEnvelopes, idKey(id)))
				if err != nil || string(e.Payload) != fmt.Sprint(i) {
					return fmt.Errorf("message of k-%d: %q, %v; want payload %d", i, e.Payload, err, i)
				}
			}
			return nil
		})
}
