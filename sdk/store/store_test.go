package store

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
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
		{1, "store format 1 is older than this release's 3 and no release wrote it"},
		{Format + 1, "store format 4 is newer than this release's 3"},
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

// damagedValue returns the path of a closed store whose bucket kv holds
// key000 to key009 in the bbolt file, with a byte flipped on disk in
// every copy of key's value there (its live page and any freed one). The
// values occur nowhere else in the file, so the flips land in values,
// never in bbolt's page structure.
func damagedValue(t *testing.T, key int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.db")
	d, err := Open(path, kvOpts)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := d.Update(func(tx *Tx) error { return tx.Put(0, kvKey(i), scannedValue(i)) }); err != nil {
			t.Fatal(err)
		}
	}
	// Close writes the values into the bbolt file; the next Open
	// replays nothing over them.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	n := 0
	editFile(t, path, func(data []byte) []byte {
		v := scannedValue(key)
		for i := 0; ; {
			j := bytes.Index(data[i:], v)
			if j < 0 {
				return data
			}
			data[i+j+len(v)/2] ^= 0x20
			n++
			i += j + len(v)
		}
	})
	if n == 0 {
		t.Fatalf("value %q not found in %s", scannedValue(key), filepath.Base(path))
	}
	return path
}

// scannedValue is the value damagedValue stores under kvKey(i): one that
// nothing else in the file contains.
func scannedValue(i int) []byte { return fmt.Appendf(nil, "scanned value %03d of 7e41c9", i) }

// TestAscendChecksum reads a bucket with a value damaged on disk through
// Ascend, the scan read path, as Scan and as View: Ascend hands out the
// keys before the damaged one and stops, the read fails with a
// *CorruptError naming the key, and the store counts it and refuses
// writes.
func TestAscendChecksum(t *testing.T) {
	const damaged = 5
	tests := []struct {
		name string
		read func(d *DB, fn func(*Snapshot) error) error
		from []byte
		want []string // the keys Ascend hands out
	}{
		{
			name: "Scan from the first key",
			read: func(d *DB, fn func(*Snapshot) error) error { return d.Scan(fn) },
			want: []string{"key000", "key001", "key002", "key003", "key004"},
		},
		{
			name: "Scan from a later key",
			read: func(d *DB, fn func(*Snapshot) error) error { return d.Scan(fn) },
			from: kvKey(3),
			want: []string{"key003", "key004"},
		},
		{
			name: "View",
			read: func(d *DB, fn func(*Snapshot) error) error { return d.View(fn) },
			want: []string{"key000", "key001", "key002", "key003", "key004"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Open(damagedValue(t, damaged), kvOpts)
			if err != nil {
				t.Fatalf("Open with a damaged value = %v, want it to open: only a read meets the value", err)
			}
			t.Cleanup(func() { _ = d.Close() })
			var got []string
			err = tt.read(d, func(s *Snapshot) error {
				s.Ascend(0, tt.from, nil, func(k, v []byte) bool {
					got = append(got, string(k))
					var i int
					if _, err := fmt.Sscanf(string(k), "key%03d", &i); err != nil || !bytes.Equal(v, scannedValue(i)) {
						t.Errorf("Ascend handed out %s = %q, want %q", k, v, scannedValue(i))
					}
					return true
				})
				return nil
			})
			var ce *CorruptError
			if want := fmt.Sprintf("bucket kv key %q", kvKey(damaged)); !errors.As(err, &ce) || ce.Where != want {
				t.Errorf("%s over a damaged value = %v, want a *CorruptError at %s", tt.name, err, want)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("keys Ascend handed out mismatch (-want +got):\n%s", diff)
			}
			if n := d.Corruptions(); n != 1 {
				t.Errorf("Corruptions() = %d, want 1", n)
			}
			if err := d.Err(); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Err() after reading a damaged value = %v, want ErrCorrupt", err)
			}
		})
	}
}

// TestCheckpointLag follows one store through a checkpoint that has
// rotated the log and not yet committed (Rotate): CheckpointLag counts
// from the oldest group not in the bbolt file, its frozen generation's
// first, through the rotation, while a newer group waits behind it; it
// is zero exactly when Pending is false, once the last checkpoint has
// committed.
func TestCheckpointLag(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), "s.db"), kvOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	put := func(i int) time.Time {
		t.Helper()
		if err := d.Update(func(tx *Tx) error { return tx.Put(0, kvKey(i), scannedValue(i)) }); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	// lagAtLeast checks that the lag is at least the time since since
	// (taken after the group it counts from was logged).
	lagAtLeast := func(step string, since time.Time) {
		t.Helper()
		least := time.Since(since)
		if lag := d.CheckpointLag(); lag < least || !d.Pending() {
			t.Errorf("%s: CheckpointLag() = %v, Pending() = %t; want at least %v, pending", step, lag, d.Pending(), least)
		}
	}
	none := func(step string) {
		t.Helper()
		if lag := d.CheckpointLag(); lag != 0 || d.Pending() {
			t.Errorf("%s: CheckpointLag() = %v, Pending() = %t; want 0, not pending", step, lag, d.Pending())
		}
	}

	none("after Open")
	first := put(0)
	lagAtLeast("after a group", first)
	if err := Rotate(d); err != nil {
		t.Fatal(err)
	}
	lagAtLeast("during a checkpoint, after the rotation", first)
	// The newer group's own age would be less than the time since first:
	// the rotation and an fdatasync came in between.
	second := put(1)
	lagAtLeast("during a checkpoint, with a newer group", first)
	if err := d.Checkpoint(); err != nil { // commits the frozen generation
		t.Fatal(err)
	}
	lagAtLeast("with the newer group waiting", second)
	if err := d.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	none("after the last checkpoint")
}

// TestDescendChecksum reads a bucket with a value damaged on disk through
// Descend: it hands out the keys after the damaged one, last first, and
// stops there, and the read fails with a *CorruptError naming the key.
func TestDescendChecksum(t *testing.T) {
	const damaged = 5
	d, err := Open(damagedValue(t, damaged), kvOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	var got []string
	err = d.Scan(func(s *Snapshot) error {
		s.Descend(0, kvKey(2), nil, func(k, _ []byte) bool {
			got = append(got, string(k))
			return true
		})
		return nil
	})
	var ce *CorruptError
	if want := fmt.Sprintf("bucket kv key %q", kvKey(damaged)); !errors.As(err, &ce) || ce.Where != want {
		t.Errorf("Descend over a damaged value = %v, want a *CorruptError at %s", err, want)
	}
	if diff := cmp.Diff([]string{"key009", "key008", "key007", "key006"}, got); diff != "" {
		t.Errorf("keys Descend handed out mismatch (-want +got):\n%s", diff)
	}
}
