package store

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"

	berrors "go.etcd.io/bbolt/errors"
)

// TestPutRefuses checks that Tx writes refuse what a checkpoint could not
// write with the store's own errors, never bbolt's, and that the group
// they fail leaves nothing.
func TestPutRefuses(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), "s.db"), kvOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	long := bytes.Repeat([]byte("k"), MaxKeySize+1)
	for _, tc := range []struct {
		name string
		fn   func(*Tx) error
		want error
	}{
		{"Put of an empty key", func(tx *Tx) error { return tx.Put(0, nil, []byte("v")) }, ErrKeyRequired},
		{"Delete of an empty key", func(tx *Tx) error { return tx.Delete(0, []byte{}) }, ErrKeyRequired},
		{"Put of a key over MaxKeySize", func(tx *Tx) error { return tx.Put(0, long, nil) }, ErrKeyTooLarge},
		{"Put to bucket 1 of 1", func(tx *Tx) error { return tx.Put(1, []byte("k"), nil) }, ErrNoBucket},
		{"Delete from bucket -1", func(tx *Tx) error { return tx.Delete(-1, []byte("k")) }, ErrNoBucket},
		{"DeleteRange of bucket 1 of 1", func(tx *Tx) error { return tx.DeleteRange(1, nil, nil) }, ErrNoBucket},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := d.Update(func(tx *Tx) error {
				if err := tx.Put(0, []byte("before"), []byte("v")); err != nil {
					return err
				}
				return tc.fn(tx)
			})
			if !errors.Is(err, tc.want) || errors.Is(err, berrors.ErrKeyRequired) || errors.Is(err, berrors.ErrKeyTooLarge) {
				t.Errorf("%s = %v, want %v and no bbolt error", tc.name, err, tc.want)
			}
			_ = d.View(func(s *Snapshot) error {
				if v := s.Get(0, []byte("before")); v != nil {
					t.Errorf("the failed group's Put is there: %q", v)
				}
				return nil
			})
		})
	}
}
