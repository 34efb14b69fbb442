package main

import (
	"crypto/ed25519"
	"encoding/base64"
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

// apply applies ops from the head expected.
func (l *testLog) apply(expected head, ops ...op) ([]result, error) {
	var out []result
	err := l.db.Update(func(tx *store.Tx) (err error) {
		out, err = l.r.apply(tx, time.Unix(1e9, 0), expected, ops)
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
