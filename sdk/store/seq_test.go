package store

import (
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestSeqKey checks the sequence counter's place in the file: a store
// whose groups never call NextSeq writes no "seq" key (its files stay as
// a release without the counter reads them); once one does, a
// checkpoint writes it framed into the store's bucket, and Check and
// Open accept it.
func TestSeqKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	seqIn := func() []byte {
		t.Helper()
		db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var v []byte
		_ = db.View(func(tx *bolt.Tx) error {
			if fv := tx.Bucket(bucketStore).Get(keySeq); fv != nil {
				var ok bool
				if v, ok = unframe(keySeq, fv); !ok {
					t.Errorf("store key seq = %x, not framed", fv)
				}
			}
			return nil
		})
		return v
	}
	cycle := func(fn func(*Tx) error) {
		t.Helper()
		d, err := Open(path, kvOpts)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Update(fn); err != nil {
			t.Fatal(err)
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		if rep, err := Check(path, kvOpts); err != nil || !rep.OK() {
			t.Errorf("Check = %+v, %v; want no problems", rep, err)
		}
	}
	cycle(func(tx *Tx) error { return tx.Put(0, kvKey(0), []byte("v")) })
	if v := seqIn(); v != nil {
		t.Errorf("store key seq = %x after groups that never called NextSeq, want none", v)
	}
	cycle(func(tx *Tx) error { tx.NextSeq(); tx.NextSeq(); return nil })
	if v := seqIn(); decodeSeq(v) != 2 {
		t.Errorf("store key seq = %x after two NextSeq, want 2", v)
	}
	var got uint64
	cycle(func(tx *Tx) error { got = tx.NextSeq(); return nil })
	if got != 3 {
		t.Errorf("NextSeq after reopen = %d, want 3", got)
	}
}
