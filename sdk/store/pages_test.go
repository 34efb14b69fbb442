package store

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// closedStore returns a closed store of 2,000 keys in bucket kv: its
// bucket has branch pages.
func closedStore(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.db")
	d, err := Open(path, kvOpts)
	if err != nil {
		t.Fatal(err)
	}
	for g := range 20 {
		err := d.Update(func(tx *Tx) error {
			for i := range 100 {
				if err := tx.Put(0, kvKey(g*100+i), []byte("a value of some length")); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// regionOf returns the first region of kind in bucket of the file at
// path.
func regionOf(t *testing.T, path, kind, bucket string) region {
	t.Helper()
	w, err := walkBoltFile(path, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range w.regions {
		if r.kind == kind && r.bucket == bucket {
			return r
		}
	}
	t.Fatalf("no %s region in bucket %q", kind, bucket)
	return region{}
}

func TestWalkHealthy(t *testing.T) {
	for name, path := range map[string]string{"closed": closedStore(t), "open, two log generations": twoGenerations(t)} {
		w, err := walkBoltFile(path, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(w.problems) > 0 || w.omitted > 0 {
			t.Errorf("walk of a healthy %s store = %v", name, w.problems)
		}
		kinds := map[string]bool{}
		for _, r := range w.regions {
			kinds[r.kind] = true
		}
		for _, k := range []string{regionMeta, regionLeafHeader, regionLeafElements, regionLeafKeys, regionLeafValues, regionBucketHeader} {
			if !kinds[k] {
				t.Errorf("walk of a healthy %s store has no %s region", name, k)
			}
		}
	}
}

// TestWalkDamage checks that a damaged page makes Open refuse and Check
// report it, naming the page, without a fault: bbolt, left to walk such
// a tree in a goroutine of its own, kills the process.
func TestWalkDamage(t *testing.T) {
	ne := binary.NativeEndian
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string, b []byte) []byte
		where  string // a prefix
		what   string
	}{
		{
			name: "branch child past the end of the file",
			damage: func(t *testing.T, path string, b []byte) []byte {
				r := regionOf(t, path, regionBranchElements, "kv")
				ne.PutUint64(b[r.off+8:], 1<<40)
				return b
			},
			where: "page 1099511627776", what: "outside pages 2 to",
		},
		{
			name: "branch child reached twice",
			damage: func(t *testing.T, path string, b []byte) []byte {
				r := regionOf(t, path, regionBranchElements, "kv")
				copy(b[r.off+branchElemSize+8:r.off+branchElemSize+16], b[r.off+8:r.off+16])
				return b
			},
			where: "page ", what: "reached twice",
		},
		{
			name: "leaf element's key position",
			damage: func(t *testing.T, path string, b []byte) []byte {
				r := regionOf(t, path, regionLeafElements, "kv")
				b[r.off+leafElemSize+4]++
				return b
			},
			where: "page ", what: "element 1's key at offset",
		},
		{
			name: "page header's id",
			damage: func(t *testing.T, path string, b []byte) []byte {
				r := regionOf(t, path, regionLeafHeader, "kv")
				b[r.off] ^= 0xff
				return b
			},
			where: "page ", what: "its header says page",
		},
		{
			name: "leaf key out of order",
			damage: func(t *testing.T, path string, b []byte) []byte {
				r := regionOf(t, path, regionLeafKeys, "kv")
				b[r.off] = 'z'
				return b
			},
			where: "page ", what: "is not",
		},
		{
			name: "file cut short",
			damage: func(t *testing.T, path string, b []byte) []byte {
				w, err := walkBoltFile(path, false)
				if err != nil {
					t.Fatal(err)
				}
				return b[:int64(w.hwm-1)*w.pageSize]
			},
			where: "meta page ", what: "past the end of the file",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := closedStore(t)
			editFile(t, path, func(b []byte) []byte { return tc.damage(t, path, b) })
			rep, err := Check(path, kvOpts)
			if err != nil {
				t.Fatalf("Check = %v, want a report", err)
			}
			if rep.OK() || rep.Problems[0].File != "s.db" || !strings.HasPrefix(rep.Problems[0].Where, tc.where) || !strings.Contains(rep.Problems[0].What, tc.what) {
				t.Errorf("Check = %+v, want a problem at %s: %s", rep.Problems, tc.where, tc.what)
			}
			d, err := Open(path, kvOpts)
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.File != "s.db" || !strings.HasPrefix(ce.Where, tc.where) || !strings.Contains(ce.Problem, tc.what) {
				t.Errorf("Open = %v, want a *CorruptError at %s: %s", err, tc.where, tc.what)
			}
			if d != nil {
				_ = d.Close()
			}
		})
	}
}

// TestDamagedMetaPage checks that a damaged newest meta page, which bbolt
// falls back from to a file older than the log, is what Open's refusal
// and Check name, not the log.
func TestDamagedMetaPage(t *testing.T) {
	path := twoGenerations(t)
	w, err := walkBoltFile(path, false)
	if err != nil {
		t.Fatal(err)
	}
	newest := w.metaUsed
	editFile(t, path, func(b []byte) []byte {
		b[int64(newest)*w.pageSize+pageHeaderSize+metaSumOffset] ^= 0xff
		return b
	})
	where := "meta page " + string(rune('0'+newest))
	d, err := Open(path, kvOpts)
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.File != "s.db" || ce.Where != where || !strings.Contains(ce.Problem, "checksum mismatch; bbolt falls back to meta page") {
		t.Errorf("Open = %v, want a *CorruptError naming s.db %s", err, where)
	}
	if d != nil {
		_ = d.Close()
	}
	rep, err := Check(path, kvOpts)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() || rep.Repairable || rep.Problems[0].File != "s.db" || rep.Problems[0].Where != where {
		t.Errorf("Check = %+v, want an unrepairable problem at s.db %s", rep, where)
	}
}

// FuzzWalkBolt checks that the walk of a bbolt file never panics, and
// that bbolt's own check, let at a file the walk finds sound, neither.
func FuzzWalkBolt(f *testing.F) {
	path := filepath.Join(f.TempDir(), "s.db")
	d, err := Open(path, kvOpts)
	if err != nil {
		f.Fatal(err)
	}
	err = d.Update(func(tx *Tx) error {
		for i := range 300 {
			if err := tx.Put(0, kvKey(i), []byte("v")); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = d.Close()
	}
	if err != nil {
		f.Fatal(err)
	}
	healthy, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	w, err := walkBoltFile(path, false)
	if err != nil {
		f.Fatal(err)
	}
	// Seeds: the file, with a byte flipped in each page's header and
	// first elements.
	f.Add(healthy, -1)
	for p := int64(0); p < int64(w.hwm); p++ {
		for _, at := range []int64{0, 8, 10, 12, 16, 20, 24, 28} {
			f.Add(healthy, int(p*w.pageSize+at))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, flip int) {
		if flip >= 0 && flip < len(data) {
			data = append([]byte(nil), data...)
			data[flip] ^= 0xff
		}
		p := filepath.Join(t.TempDir(), "s.db")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Check(p, Options{}); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Logf("Check = %v", err)
		}
	})
}
