package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// flipAll XORs with 0xff the byte at offset at of every copy of pattern
// in the file at p (its live page and any freed one), and returns how
// many it flipped.
func flipAll(t *testing.T, p string, pattern []byte, at int) int {
	t.Helper()
	n := 0
	editFile(t, p, func(data []byte) []byte {
		for i := 0; ; {
			j := bytes.Index(data[i:], pattern)
			if j < 0 {
				return data
			}
			data[i+j+at] ^= 0xff
			n++
			i += j + len(pattern)
		}
	})
	if n == 0 {
		t.Fatalf("%q not found in %s", pattern, filepath.Base(p))
	}
	return n
}

// storeElement is a key of the store's bucket followed by its framed
// value as bbolt lays them out, key then value; frame is false for
// formatUnframed's.
func storeElement(t *testing.T, path string, key []byte) []byte {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	var el []byte
	if err := db.View(func(tx *bolt.Tx) error {
		el = append(bytes.Clone(key), tx.Bucket(bucketStore).Get(key)...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return el
}

// TestStoreBucketDamage damages the store's own bucket of a store that a
// crash left with groups in its log (its open flag set): each flip, in a
// key or a value of the bucket, and a key lost from it, is refused by
// Open and reported by Check, naming the bucket. Before the bucket's
// keys had checksums, a flipped open flag read as "closed cleanly", and
// Open left the log's acknowledged groups out.
func TestStoreBucketDamage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string)
	}{
		{"open flag's value", func(t *testing.T, path string) {
			el := storeElement(t, path, keyOpen)
			flipAll(t, path, el, len(el)-1)
		}},
		{"open flag's key", func(t *testing.T, path string) {
			flipAll(t, path, storeElement(t, path, keyOpen), 0)
		}},
		{"format's value", func(t *testing.T, path string) {
			el := storeElement(t, path, keyFormat)
			flipAll(t, path, el, len(el)-1)
		}},
		{"generation's value", func(t *testing.T, path string) {
			el := storeElement(t, path, keyWALGen)
			flipAll(t, path, el, len(el)-3)
		}},
		{"bucket sum's value", func(t *testing.T, path string) {
			el := storeElement(t, path, sumsKey([]byte("kv")))
			flipAll(t, path, el, len(el)-1)
		}},
		{"open flag lost", func(t *testing.T, path string) {
			boltEdit(t, path, func(st *bolt.Bucket) error { return st.Delete(keyOpen) })
		}},
		{"a key the store never writes", func(t *testing.T, path string) {
			boltEdit(t, path, func(st *bolt.Bucket) error { return putFramed(st, []byte("opem"), u64(1)) })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := twoGenerations(t)
			tc.damage(t, path)
			d, err := Open(path, kvOpts)
			var ce *CorruptError
			if !errors.As(err, &ce) || !inStoreBucket(ce.Where) || ce.File != "s.db" {
				if d != nil {
					_ = d.Close()
				}
				t.Errorf("Open = %v, want a *CorruptError in s.db bucket store", err)
			}
			rep, err := Check(path, kvOpts)
			if err != nil || rep.OK() || rep.Repairable || !inStoreBucket(rep.Problems[0].Where) {
				t.Errorf("Check = %+v, %v; want an unrepairable problem in bucket store", rep, err)
			}
		})
	}
}

// inStoreBucket reports whether where names the store's bucket: its keys
// (readLayout), or its page, when a flipped key is out of order there
// (the walk of Open and Check).
func inStoreBucket(where string) bool {
	return strings.HasPrefix(where, "bucket store") || strings.Contains(where, `bucket "store"`)
}

// boltEdit changes the store's bucket of the closed file at path
// through bbolt, as damage that bbolt's own checks cannot see would.
func boltEdit(t *testing.T, path string, fn func(st *bolt.Bucket) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error { return fn(tx.Bucket(bucketStore)) })
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestConvertUnframed opens a store of formatUnframed, whose store
// bucket held its keys without checksums and no sums, left by a crash
// with groups in its log: Open replays them and converts the file, after
// which Check finds it whole and every value reads back.
func TestConvertUnframed(t *testing.T) {
	path := twoGenerations(t)
	boltEdit(t, path, func(st *bolt.Bucket) error {
		var keys [][]byte
		_ = st.ForEach(func(k, _ []byte) error { keys = append(keys, bytes.Clone(k)); return nil })
		for _, k := range keys {
			fv := st.Get(k)
			v, ok := unframe(k, fv)
			if !ok {
				return fmt.Errorf("key %q unframed already", k)
			}
			if bytes.HasPrefix(k, keySums) {
				if err := st.Delete(k); err != nil {
					return err
				}
				continue
			}
			if bytes.Equal(k, keyFormat) {
				v = u64(formatUnframed)
			}
			if err := st.Put(k, bytes.Clone(v)); err != nil {
				return err
			}
		}
		return nil
	})
	if got := keysIn(t, path); len(got) != 2*perGen {
		t.Fatalf("after converting, the store holds the logged keys %v, want 0 to %d", got, 2*perGen-1)
	}
	rep, err := Check(path, kvOpts)
	if err != nil || !rep.OK() {
		t.Fatalf("Check after converting = %+v, %v; want healthy", rep, err)
	}
	v := storeElement(t, path, keyFormat)[len(keyFormat):]
	if got, ok := unframe(keyFormat, v); !ok || binary.BigEndian.Uint64(got) != Format {
		t.Errorf("format after converting = %x, want %d with its checksum", v, Format)
	}
}

// TestLostValue removes a value from a bucket of a closed store behind
// the store's back, as damage to a leaf page's element headers can: no
// checksum fails, but the scrubber, within one pass, and Check report
// the bucket's count short, and the store refuses writes.
func TestLostValue(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	d, err := Open(path, kvOpts)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		putKV(t, d, kvKey(i), scannedValue(i))
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("kv")).Delete(kvKey(150)) })
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Check(path, kvOpts)
	if err != nil || rep.OK() || rep.Problems[0].Where != "bucket kv" || !strings.Contains(rep.Problems[0].What, "holds 299 values, but its count says 300") {
		t.Errorf("Check = %+v, %v; want bucket kv's count short by one", rep, err)
	}
	d, err = Open(path, kvOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	var scrubErr error
	for range 300 {
		st, err := d.Scrub(7)
		if err != nil {
			scrubErr = err
			break
		}
		if st.Wrapped {
			break
		}
	}
	var ce *CorruptError
	if !errors.As(scrubErr, &ce) || ce.Where != "bucket kv" {
		t.Errorf("a scrub pass = %v, want a *CorruptError at bucket kv", scrubErr)
	}
	if err := d.Update(func(tx *Tx) error { return tx.Put(0, kvKey(1), []byte("x")) }); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Update after the scrubber found a lost value = %v, want ErrCorrupt", err)
	}
}

// TestScrubSumsFollowCheckpoints runs scrub passes in small slices while
// checkpoints write, overwrite and delete keys on both sides of where
// the scrubber is: every pass completes without a false alarm, because
// a checkpoint brings the scrubber's running sum up to date.
func TestScrubSumsFollowCheckpoints(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), "s.db"), kvOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	for i := range 200 {
		putKV(t, d, kvKey(i), scannedValue(i))
	}
	if err := d.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	passes := 0
	for step := 0; passes < 4; step++ {
		st, err := d.Scrub(13)
		if err != nil {
			t.Fatalf("scrub slice %d: %v", step, err)
		}
		if st.Wrapped {
			passes++
		}
		// Overwrite one key, delete one and add one, spread over the
		// key space, then checkpoint them.
		k := (step * 37) % 250
		if err := d.Update(func(tx *Tx) error {
			if err := tx.Put(0, kvKey(k), fmt.Appendf(nil, "step %d", step)); err != nil {
				return err
			}
			return tx.Delete(0, kvKey((k+101)%250))
		}); err != nil {
			t.Fatal(err)
		}
		if err := d.Checkpoint(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMissFindsDamage damages the element header of a key in a leaf
// page of an open store, as the disk might under a running store (Open
// walks the file and refuses such a page): bbolt's search can no longer
// find the key, and a lookup of it answers corruption, never "not
// found".
func TestMissFindsDamage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	d, err := Open(path, kvOpts)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		putKV(t, d, kvKey(i), scannedValue(i))
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		field int // the byte flipped in the element header: flags 0-3, pos 4-7, ksize 8-11; -1 the key's last
	}{
		{"flags", 0}, {"pos", 7}, {"ksize", 11}, {"key's last byte", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := imageOf(t, path)
			d, err := Open(p, kvOpts)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = d.Close() }()
			const key = 150
			if n := flipLeafElement(t, p, kvKey(key), tc.field); n == 0 {
				t.Fatal("no leaf element holds the key")
			}
			var got []byte
			err = d.View(func(s *Snapshot) error { got = bytes.Clone(s.Get(0, kvKey(key))); return nil })
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("Get of the damaged element's key = %q, %v; want ErrCorrupt", got, err)
			}
		})
	}
}

// flipLeafElement XORs with 0xff the byte at field of the element header
// of key (field -1: the key's last byte) in every leaf page of the file
// at p (live and freed copies), in place, and returns how many it
// flipped.
func flipLeafElement(t *testing.T, p string, key []byte, field int) int {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	const pageSize = 4096
	n := 0
	for off := 2 * pageSize; off+pageSize <= len(data); off += pageSize {
		pg := data[off : off+pageSize]
		if binary.LittleEndian.Uint16(pg[8:]) != 0x02 { // a leaf page
			continue
		}
		count := int(binary.LittleEndian.Uint16(pg[10:]))
		for i := range count {
			el := 16 + 16*i
			if el+16 > len(pg) {
				break
			}
			pos := int(binary.LittleEndian.Uint32(pg[el+4:]))
			ksize := int(binary.LittleEndian.Uint32(pg[el+8:]))
			if k := el + pos; k+ksize <= len(pg) && bytes.Equal(pg[k:k+ksize], key) {
				at := el + field
				if field < 0 {
					at = k + ksize - 1
				}
				if _, err := f.WriteAt([]byte{pg[at] ^ 0xff}, int64(off+at)); err != nil {
					t.Fatal(err)
				}
				n++
			}
		}
	}
	return n
}
