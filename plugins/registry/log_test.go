package main

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/plughost/plughost/sdk/store"
)

// testLog is a store with the registry's layout and the rules to apply
// to it, outside the plugin.
type testLog struct {
	t  *testing.T
	db *store.DB
	r  rules
}

func newTestLog(t *testing.T, origin string) *testLog {
	t.Helper()
	db, err := store.Open(filepath.Join(t.TempDir(), storeFile), storeOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	signer, _, err := loadSigner(t.TempDir(), "", origin)
	if err != nil {
		t.Fatal(err)
	}
	return &testLog{t, db, rules{quorum: 2, ttl: time.Hour, origin: origin, signer: signer}}
}

func (l *testLog) head() head {
	var h head
	err := l.db.View(func(s *store.Snapshot) (err error) {
		h, err = decodeHead(s.Get(bucketMeta, keyHead))
		return err
	})
	if err != nil {
		l.t.Fatal(err)
	}
	return h
}

// t0 is the testLog's clock, unless a test applies ops at another time.
var t0 = time.Unix(1e9, 0)

// apply applies ops from the head expected, at t0.
func (l *testLog) apply(expected head, ops ...op) ([]result, error) {
	return l.applyAt(t0, expected, ops...)
}

// applyAt applies ops from the head expected, at now.
func (l *testLog) applyAt(now time.Time, expected head, ops ...op) ([]result, error) {
	var out []result
	err := l.db.Update(func(tx *store.Tx) (err error) {
		out, err = l.r.apply(tx, now, expected, ops)
		return err
	})
	return out, err
}

// commitN commits n artifacts.
func (l *testLog) commitN(n int) {
	for i := range n {
		canon := fmt.Appendf(nil, `{"i":%d}`, i)
		d := digestOf(canon)
		id := fmt.Sprintf("%032x", l.head().Version+1)
		ops := []op{{kind: opPropose, id: id, digest: d, artifact: canon}}
		for _, name := range []string{"a", "b"} {
			ops = append(ops, op{kind: opApprove, id: id, approval: approval{name, base64.StdEncoding.EncodeToString(ed25519.Sign(key(name), d[:]))}})
		}
		if _, err := l.apply(l.head(), ops...); err != nil {
			l.t.Fatal(err)
		}
	}
}

// TestHeadCompareAndSet: a group applied from a head that is not the
// stored one commits nothing.
func TestHeadCompareAndSet(t *testing.T) {
	l := newTestLog(t, "cas")
	l.commitN(2)
	stale := head{Version: 1}
	before := l.head()
	_, err := l.apply(stale, op{kind: opPropose, id: fmt.Sprintf("%032x", 99), artifact: []byte(`{}`)})
	if !errors.Is(err, errCAS) {
		t.Fatalf("apply from a stale head = %v, want errCAS", err)
	}
	if after := l.head(); after != before {
		t.Errorf("head moved from %+v to %+v", before, after)
	}
}

// TestCheckpointOncePerSize: a checkpoint asked for at a size already
// signed returns the stored note, even with another key; a new size gets
// a new one.
func TestCheckpointOncePerSize(t *testing.T) {
	l := newTestLog(t, "once")
	l.commitN(3)
	rs, err := l.apply(l.head(), op{kind: opCheckpoint})
	if err != nil || rs[0].ckptN != 3 || !rs[0].wrote {
		t.Fatalf("first checkpoint = %+v, %v", rs, err)
	}
	first := rs[0].ckpt
	other, _, err := loadSigner(t.TempDir(), "", "once") // another key, same name
	if err != nil {
		t.Fatal(err)
	}
	l.r.signer = other
	rs, err = l.apply(l.head(), op{kind: opCheckpoint})
	if err != nil || string(rs[0].ckpt) != string(first) || rs[0].wrote {
		t.Fatalf("checkpoint again at size 3 = %q (wrote %v), %v; want the stored %q", rs[0].ckpt, rs[0].wrote, err, first)
	}
	l.commitN(1)
	rs, err = l.apply(l.head(), op{kind: opCheckpoint})
	if err != nil || rs[0].ckptN != 4 || string(rs[0].ckpt) == string(first) {
		t.Fatalf("checkpoint at size 4 = %+v, %v", rs, err)
	}
}

// TestPruneBelowCheckpointOnly: prune never passes the latest checkpoint,
// goes in batches of pruneBatch, and leaves HEAD and the tree alone.
func TestPruneBelowCheckpointOnly(t *testing.T) {
	l := newTestLog(t, "prune")
	l.commitN(5)
	if rs, err := l.apply(l.head(), op{kind: opPrune, below: 5}); err != nil || rs[0].wrote {
		t.Fatalf("prune before any checkpoint = %+v, %v; want nothing pruned", rs, err)
	}
	if _, err := l.apply(l.head(), op{kind: opCheckpoint}); err != nil {
		t.Fatal(err)
	}
	l.commitN(2) // head 7, checkpoint 5
	h := l.head()
	rs, err := l.apply(h, op{kind: opPrune, below: 7})
	if err != nil || rs[0].pruned != 5 {
		t.Fatalf("prune below 7 with checkpoint 5 = %+v, %v; want versions 1..4 pruned (kept from 5)", rs, err)
	}
	err = l.db.View(func(s *store.Snapshot) error {
		for v := uint64(1); v <= 7; v++ {
			if got := s.Get(bucketEntries, be64(v)) != nil; got != (v >= 5) {
				return fmt.Errorf("entry %d present %v", v, got)
			}
		}
		return checkTree(s, &signedCheckpoint{n: 5, note: s.Get(bucketCheckpoints, be64(5))})
	})
	if err != nil {
		t.Error(err)
	}
	if l.head() != h {
		t.Errorf("prune moved head")
	}
}

func TestPruneBatches(t *testing.T) {
	l := newTestLog(t, "batches")
	l.commitN(pruneBatch + 3)
	if _, err := l.apply(l.head(), op{kind: opCheckpoint}); err != nil {
		t.Fatal(err)
	}
	rs, err := l.apply(l.head(), op{kind: opPrune, below: pruneBatch + 3})
	if err != nil || rs[0].pruned != pruneBatch+1 {
		t.Fatalf("first prune = %+v, %v; want kept from %d", rs, err, pruneBatch+1)
	}
	rs, err = l.apply(l.head(), op{kind: opPrune, below: pruneBatch + 3})
	if err != nil || rs[0].pruned != pruneBatch+3 {
		t.Fatalf("second prune = %+v, %v; want kept from %d", rs, err, pruneBatch+3)
	}
}

// TestSweepExpired: a sweep deletes the proposals whose ttl is up (at
// their expiry to the millisecond, not before), sweepBatch per op, and
// no proposal that has not expired; a committed proposal leaves the
// expiry index and keeps its version, but not its artifact.
func TestSweepExpired(t *testing.T) {
	l := newTestLog(t, "sweep")
	propose := func(at time.Time, n int) []string {
		var ids []string
		for i := range n {
			id := fmt.Sprintf("%016x%016x", at.UnixMilli(), i)
			canon := fmt.Appendf(nil, `{"i":%d}`, i)
			if _, err := l.applyAt(at, l.head(), op{kind: opPropose, id: id, digest: digestOf(canon), artifact: canon}); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		return ids
	}
	early := propose(t0, sweepBatch+44)
	late := propose(t0.Add(time.Minute), 5)
	committed := early[7]
	d := digestOf([]byte(`{"i":7}`))
	for _, name := range []string{"a", "b"} {
		sig := base64.StdEncoding.EncodeToString(ed25519.Sign(key(name), d[:]))
		if _, err := l.apply(l.head(), op{kind: opApprove, id: committed, approval: approval{name, sig}}); err != nil {
			t.Fatal(err)
		}
	}
	count := func(b int) (n int) {
		_ = l.db.View(func(s *store.Snapshot) error {
			s.Ascend(b, nil, nil, func(_, _ []byte) bool { n++; return true })
			return nil
		})
		return n
	}
	if n := count(bucketExpiry); n != len(early)-1+len(late) {
		t.Fatalf("expiry index holds %d keys, want %d: the committed proposal's left it", n, len(early)-1+len(late))
	}
	// Were the committed proposal's key still in the index, the sweep
	// would keep its record all the same.
	if err := l.db.Update(func(tx *store.Tx) error {
		return tx.Put(bucketExpiry, expiryKey(t0.Add(l.r.ttl).UnixMilli(), committed), nil)
	}); err != nil {
		t.Fatal(err)
	}
	expiry := t0.Add(l.r.ttl)
	sweep := func(at time.Time) result {
		t.Helper()
		rs, err := l.applyAt(at, l.head(), op{kind: opSweep})
		if err != nil {
			t.Fatal(err)
		}
		return rs[0]
	}
	if r := sweep(expiry.Add(-time.Millisecond)); r.swept != 0 || r.wrote {
		t.Fatalf("sweep 1ms before the expiry = %+v, want nothing swept", r)
	}
	if r := sweep(expiry); r.swept != sweepBatch-1 || !r.more {
		t.Fatalf("first sweep at the expiry = swept %d more %v, want %d and more", r.swept, r.more, sweepBatch-1)
	}
	if r := sweep(expiry); r.swept != len(early)-sweepBatch || r.more {
		t.Fatalf("second sweep = swept %d more %v, want %d and no more", r.swept, r.more, len(early)-sweepBatch)
	}
	if n := count(bucketProposals); n != len(late)+1 {
		t.Errorf("%d proposals left, want the %d not expired and the committed one", n, len(late))
	}
	if n := count(bucketExpiry); n != len(late) {
		t.Errorf("expiry index holds %d keys, want the %d not expired", n, len(late))
	}
	err := l.db.View(func(s *store.Snapshot) error {
		var p proposal
		if err := json.Unmarshal(s.Get(bucketProposals, []byte(committed)), &p); err != nil {
			return err
		}
		if p.Version != 1 || p.Hash == "" || p.Artifact != nil || p.Approvals != nil {
			return fmt.Errorf("committed proposal after the sweep = %+v, want version 1 and its hash, no artifact or approvals", p)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}
