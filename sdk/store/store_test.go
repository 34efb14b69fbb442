package store

import (
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestFormat checks that a store file of a format other than Format is
// refused, by Open and by Check, saying which format it is and why it is
// not read.
func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		format uint64
		want   string
	}{
		{Format - 1, "store format 1 is older than this release's 2 and no release wrote it"},
		{Format + 1, "store format 3 is newer than this release's 2"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s.db")
			d, err := Open(path, kvOpts)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketStore).Put(keyFormat, u64(tc.format)) })
			if cerr := db.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
			if d, err := Open(path, kvOpts); err == nil || !strings.Contains(err.Error(), tc.want) {
				if d != nil {
					_ = d.Close()
				}
				t.Errorf("Open(format %d) = %v, want %q", tc.format, err, tc.want)
			}
			rep, err := Check(path, kvOpts)
			if err != nil || rep.OK() || rep.Repairable || !strings.Contains(rep.Problems[0].What, tc.want) {
				t.Errorf("Check(format %d) = %+v, %v; want an unrepairable problem %q", tc.format, rep, err, tc.want)
			}
		})
	}
}
