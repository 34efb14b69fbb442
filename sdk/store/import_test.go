package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

var importOpts = Options{Buckets: []Bucket{{Name: "kv"}, {Name: "log", Sequential: true}}}

// TestImport imports puts, overwrites, deletes and a sequence counter in
// several bbolt transactions, in place of a file of another layout and
// beside log files of another store: Open then finds exactly the writes'
// outcome, nothing replayed, the old log cleared, the buckets' sums in
// agreement (Check) and the counter where SetSeq left it.
func TestImport(t *testing.T) {
	defer func(n int) { importBatch = n }(importBatch)
	importBatch = 100 // a transaction every few writes
	dir := t.TempDir()
	path := filepath.Join(dir, "s.db")
	foreignFile(t, path)
	if err := os.WriteFile(path+".wal", ForeignRecord(8), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Import(path, importOpts, func(l *Loader) error {
		for i := range 50 {
			if err := l.Put(0, fmt.Appendf(nil, "k%02d", i), fmt.Appendf(nil, "v%d", i)); err != nil {
				return err
			}
			if err := l.Put(1, u64(uint64(i)), []byte("entry")); err != nil {
				return err
			}
		}
		for i := 0; i < 50; i += 2 {
			if err := l.Delete(0, fmt.Appendf(nil, "k%02d", i)); err != nil {
				return err
			}
		}
		l.SetSeq(41)
		return l.Put(0, []byte("k01"), []byte("again"))
	})
	if err != nil {
		t.Fatalf("Import = %v", err)
	}
	if _, err := os.Stat(path + importSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Import, %s%s: %v, want it gone", path, importSuffix, err)
	}
	if rep, err := Check(path, importOpts); err != nil || !rep.OK() {
		t.Fatalf("Check after Import = %+v, %v, want healthy", rep, err)
	}
	d, err := Open(path, importOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if rec := d.Recovery(); rec.Groups != 0 || rec.Trimmed != nil || rec.Converted {
		t.Errorf("Recovery after Import = %+v, want nothing replayed or converted", rec)
	}
	var kv, entries []string
	err = d.View(func(s *Snapshot) error {
		s.Ascend(0, nil, nil, func(k, v []byte) bool { kv = append(kv, string(k)+"="+string(v)); return true })
		s.Ascend(1, nil, nil, func(k, v []byte) bool { entries = append(entries, string(v)); return true })
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(kv) != 25 || kv[0] != "k01=again" || kv[24] != "k49=v49" || len(entries) != 50 {
		t.Errorf("after Import, kv = %d keys from %v, log %d entries; want 25 odd keys, k01 overwritten, and 50 entries", len(kv), kv[:min(len(kv), 2)], len(entries))
	}
	if err := d.Update(func(tx *Tx) error {
		if n := tx.NextSeq(); n != 42 {
			t.Errorf("NextSeq after SetSeq(41) = %d, want 42", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path + ".wal")
	if g, ok := firstGen(data); err != nil || ok && g == 8 {
		t.Errorf("the other store's log after Open: %v, starts with its record %v; want it cleared", err, ok && g == 8)
	}
}

// TestImportRefused checks that an Import whose load fails, or writes
// what a store cannot hold, leaves the file at path as it was and no
// file of its own.
func TestImportRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		load func(*Loader) error
		want error
	}{
		{"load fails", func(l *Loader) error { _ = l.Put(0, []byte("k"), nil); return os.ErrInvalid }, os.ErrInvalid},
		{"empty key", func(l *Loader) error { return l.Put(0, nil, nil) }, ErrKeyRequired},
		{"no such bucket", func(l *Loader) error { return l.Delete(2, []byte("k")) }, ErrNoBucket},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s.db")
			foreignFile(t, path)
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := Import(path, importOpts, tc.load); !errors.Is(err, tc.want) {
				t.Errorf("Import = %v, want %v", err, tc.want)
			}
			if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, before) {
				t.Errorf("the file at path after a failed Import: %v, changed %v; want it as it was", err, !bytes.Equal(after, before))
			}
			if _, err := os.Stat(path + importSuffix); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("after a failed Import, %s%s: %v, want it gone", path, importSuffix, err)
			}
		})
	}
}

// TestImportStartsOver checks that a file a crashed Import left behind,
// half written, is started over.
func TestImportStartsOver(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	if err := os.WriteFile(path+importSuffix, bytes.Repeat([]byte{0xa5}, 10000), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Import(path, importOpts, func(l *Loader) error { return l.Put(0, []byte("k"), []byte("v")) }); err != nil {
		t.Fatalf("Import over a torn import file = %v", err)
	}
	d, err := Open(path, importOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_ = d.View(func(s *Snapshot) error {
		if v := s.Get(0, []byte("k")); string(v) != "v" {
			t.Errorf("Get(k) = %q, want v", v)
		}
		return nil
	})
}

// TestNotStore checks that Open and Check refuse a bbolt file with
// buckets but not the store's own, with ErrNotStore, and leave it as it
// was.
func TestNotStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	foreignFile(t, path)
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := Open(path, importOpts); !errors.Is(err, ErrNotStore) {
		if d != nil {
			_ = d.Close()
		}
		t.Errorf("Open = %v, want ErrNotStore", err)
	}
	if rep, err := Check(path, importOpts); !errors.Is(err, ErrNotStore) {
		t.Errorf("Check = %+v, %v, want ErrNotStore", rep, err)
	}
	if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, before) {
		t.Errorf("the file after Open and Check: %v, changed %v; want it as it was", err, !bytes.Equal(after, before))
	}
}

// foreignFile writes a bbolt file at path that the store did not write:
// a bucket "kv" of unframed values.
func foreignFile(t *testing.T, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("kv"))
		if err != nil {
			return err
		}
		return b.Put([]byte("old"), []byte("layout"))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
}
