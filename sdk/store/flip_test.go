package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// flipOpts are the buckets of the flip sweep's store: one whose keys are
// appended in order, and two written at random.
var flipOpts = Options{
	Buckets:            []Bucket{{Name: "accounts"}, {Name: "ledger", Sequential: true}, {Name: "kv"}},
	CheckpointInterval: time.Hour,
	// A small memory map keeps the file small: bbolt grows a file mapped
	// larger than 16 MiB by 16 MiB at a time, which every flip copies.
	Hooks: &Hooks{MmapSize: 1 << 20},
}

// flipStore is a store's files as kill -9 leaves them, and the records
// acknowledged to its clients.
type flipStore struct {
	files [3][]byte // the bbolt file, .wal, .wal.1
	want  [][2][]byte
	wantB []int // want[i]'s bucket
	// classes[f][off] is the region class of byte off of file f.
	classes [3][]string
	// used[f] is how much of file f is in use: the bbolt file's pages
	// below its high-water mark, a log file's records and the zero
	// header after them. Past that is space bbolt has not allocated, or
	// bytes of a log generation long written into the bbolt file.
	used [3]int
	// keyEnds are the offsets of the last bytes of the leaf keys of the
	// store's buckets in the bbolt file: flipped, a key often stays in
	// order, renamed.
	keyEnds []int
}

var flipSuffixes = [3]string{"", ".wal", ".wal.1"}

// buildFlipStore writes a few thousand records across three buckets:
// most checkpointed into the bbolt file (some overwritten or deleted by a
// later checkpoint), the rest only in the log, in both of its files (a
// checkpoint's generation not yet written into the file, and the one
// after it), and copies the files while the store is open.
func buildFlipStore(t *testing.T) *flipStore {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.db")
	d, err := Open(path, flipOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	acked := map[[2]string][]byte{} // bucket name, key → value; nil: deleted
	group := func(n int, fn func(i int) (b int, k, v []byte)) {
		t.Helper()
		var ws [][3][]byte
		err := d.Update(func(tx *Tx) error {
			ws = nil
			for i := range n {
				b, k, v := fn(i)
				if v == nil {
					if err := tx.Delete(b, k); err != nil {
						return err
					}
				} else if err := tx.Put(b, k, v); err != nil {
					return err
				}
				ws = append(ws, [3][]byte{[]byte(flipOpts.Buckets[b].Name), k, v})
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range ws {
			acked[[2]string{string(w[0]), string(w[1])}] = w[2]
		}
	}
	seq := 0
	ledger := func(i int) (int, []byte, []byte) {
		seq++
		return 1, fmt.Appendf(nil, "entry%08d", seq), fmt.Appendf(nil, "transfer %d of %d cents", seq, seq*37%1000)
	}
	account := func(n int) func(int) (int, []byte, []byte) {
		return func(i int) (int, []byte, []byte) {
			k := (n*31 + i*97) % 1500
			return 0, fmt.Appendf(nil, "acct-%04d", k), fmt.Appendf(nil, "balance %d at %d", k*13, n)
		}
	}
	// Checkpointed: 1,200 ledger entries, accounts, and kv values of
	// which some span pages (overflow pages).
	for n := range 60 {
		group(20, ledger)
		group(15, account(n))
	}
	group(6, func(i int) (int, []byte, []byte) {
		return 2, fmt.Appendf(nil, "big%d", i), bytes.Repeat(fmt.Appendf(nil, "%d", i), 5000+i*1000)
	})
	group(200, func(i int) (int, []byte, []byte) {
		return 2, fmt.Appendf(nil, "kv%05d", i*7), fmt.Appendf(nil, "small value %d", i)
	})
	if err := d.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	// A later checkpoint overwrites and deletes some of them.
	for n := range 10 {
		group(20, account(1000+n))
	}
	group(30, func(i int) (int, []byte, []byte) { return 2, fmt.Appendf(nil, "kv%05d", i*21), nil })
	if err := d.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	// In the log only: generation G, whose checkpoint has started its
	// successor but not committed, and G+1.
	for n := range 10 {
		group(20, ledger)
		group(10, account(2000+n))
	}
	if err := Rotate(d); err != nil {
		t.Fatal(err)
	}
	for n := range 10 {
		group(20, ledger)
		group(10, account(3000+n))
	}
	group(10, func(i int) (int, []byte, []byte) { return 2, fmt.Appendf(nil, "kv%05d", i*21+7), nil })
	s := &flipStore{}
	for i, suffix := range flipSuffixes {
		if s.files[i], err = os.ReadFile(path + suffix); err != nil {
			t.Fatal(err)
		}
	}
	keys := slices.SortedFunc(func(yield func([2]string) bool) {
		for k := range acked {
			if !yield(k) {
				return
			}
		}
	}, func(a, b [2]string) int { return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1]) })
	for _, k := range keys {
		b := slices.IndexFunc(flipOpts.Buckets, func(x Bucket) bool { return x.Name == k[0] })
		s.want = append(s.want, [2][]byte{[]byte(k[1]), acked[k]})
		s.wantB = append(s.wantB, b)
	}
	s.classify(t, path)
	return s
}

// classify names the region of every byte of the copied files.
func (s *flipStore) classify(t *testing.T, path string) {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, "s.db")
	for i, suffix := range flipSuffixes {
		if err := os.WriteFile(p+suffix, s.files[i], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	w, err := walkBoltFile(p, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.problems) > 0 {
		t.Fatalf("walk of a healthy file: %v", w.problems)
	}
	c := make([]string, len(s.files[0]))
	for i := range c {
		c[i] = "bbolt page slack"
	}
	for _, r := range w.regions {
		name := "bbolt " + r.kind
		if r.bucket == "store" {
			name = "bbolt store bucket"
		}
		for o := r.off; o < r.off+r.n; o++ {
			c[o] = name
		}
		if r.kind == regionLeafKeys && r.bucket != "" && r.bucket != "store" {
			s.keyEnds = append(s.keyEnds, int(r.off+r.n-1))
		}
	}
	s.classes[0] = c
	s.used[0] = int(w.hwm) * int(w.pageSize)
	for f := 1; f < 3; f++ {
		c := make([]string, len(s.files[f]))
		for i := range c {
			c[i] = "log tail"
		}
		for j, off := range recordOffsets(t, p+flipSuffixes[f]) {
			body, _ := nextRecord(s.files[f][off:])
			end := off + walHeader + len(body)
			s.used[f] = end + walHeader
			for o := off; o < end; o++ {
				switch {
				case j == 0:
					c[o] = "log start record"
				case o < off+walHeader:
					c[o] = "log record header"
				default:
					c[o] = "log record body"
				}
			}
		}
		s.classes[f] = c
	}
}

// Outcomes of a flip.
const (
	flipIntact   = "intact"
	flipRefused  = "refused"
	flipDetected = "detected"
	flipFail     = "FAIL"
)

// TestFlipSweep flips one byte at a time (XOR 0xff, each on a fresh copy
// of a crash-consistent store) at every Nth offset of the bbolt file and
// both log files, and more in each kind of region, and requires each
// flip to be intact (Open succeeds and every acknowledged record reads
// back), refused (Open fails with a *CorruptError naming the file) or
// detected (Open succeeds, Check reports a problem, a scrub pass fails,
// and every record read wrong fails its read with ErrCorrupt). A record
// read back wrong or missing without an error, a panic or fault, or
// Check failing instead of reporting, fails the test.
func TestFlipSweep(t *testing.T) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	s := buildFlipStore(t)
	budget := 1200 // strided flips, over all files
	if testing.Short() {
		budget = 150
	}
	perClass := 12
	if testing.Short() {
		perClass = 3
	}
	type flipAt struct {
		file int
		off  int
	}
	var flips []flipAt
	have := map[flipAt]bool{}
	add := func(f flipAt) {
		if !have[f] {
			have[f] = true
			flips = append(flips, f)
		}
	}
	// The stride covers the parts of the files in use; the rest gets
	// its share of the flips in each class below.
	stride := max((s.used[0]+s.used[1]+s.used[2])/budget, 1)
	if stride%2 == 0 {
		stride++ // not a divisor of the page size
	}
	for f := range s.files {
		for off := stride / 3; off < s.used[f]; off += stride {
			add(flipAt{f, off})
		}
	}
	// Every class gets perClass flips, spread over its bytes.
	byClass := map[string][]flipAt{}
	for f := range s.files {
		for off, c := range s.classes[f] {
			byClass[c] = append(byClass[c], flipAt{f, off})
		}
	}
	for _, at := range byClass {
		for i := range perClass {
			add(at[(2*i+1)*len(at)/(2*perClass)])
		}
	}
	for i := range perClass {
		add(flipAt{0, s.keyEnds[(2*i+1)*len(s.keyEnds)/(2*perClass)]})
	}
	t.Logf("%d flips: every %d bytes of the %d, %d and %d bytes in use of s.db, .wal and .wal.1 (of %d, %d and %d), and %d in each region and keys' last bytes",
		len(flips), stride, s.used[0], s.used[1], s.used[2], len(s.files[0]), len(s.files[1]), len(s.files[2]), perClass)

	type tally struct{ flips, intact, refused, detected, fail int }
	counts := map[string]*tally{}
	fails := map[string][]string{}
	dir := t.TempDir()
	start := time.Now()
	for i, f := range flips {
		class := s.classes[f.file][f.off]
		p := filepath.Join(dir, fmt.Sprint(i), "s.db")
		outcome, why := s.flip(t, p, f.file, f.off)
		_ = os.RemoveAll(filepath.Dir(p))
		c := counts[class]
		if c == nil {
			c = &tally{}
			counts[class] = c
		}
		c.flips++
		switch outcome {
		case flipIntact:
			c.intact++
		case flipRefused:
			c.refused++
		case flipDetected:
			c.detected++
		default:
			c.fail++
			fails[class] = append(fails[class], fmt.Sprintf("s.db%s offset %d: %s", flipSuffixes[f.file], f.off, why))
		}
	}
	t.Logf("%d flips in %v", len(flips), time.Since(start).Round(time.Millisecond))
	classes := make([]string, 0, len(counts))
	for c := range counts {
		classes = append(classes, c)
	}
	sort.Strings(classes)
	t.Logf("%-26s %6s %7s %8s %9s %5s", "region", "flips", "intact", "refused", "detected", "FAIL")
	for _, c := range classes {
		n := counts[c]
		t.Logf("%-26s %6d %7d %8d %9d %5d", c, n.flips, n.intact, n.refused, n.detected, n.fail)
	}
	for _, c := range classes {
		for j, why := range fails[c] {
			if j == 3 {
				t.Errorf("%s: %d more", c, len(fails[c])-j)
				break
			}
			t.Errorf("%s: %s", c, why)
		}
	}
}

// flip writes the store's files at path with the byte at off of file
// flipped, and says what came of it.
func (s *flipStore) flip(t *testing.T, path string, file, off int) (outcome, why string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	for i, suffix := range flipSuffixes {
		data := s.files[i]
		if i == file {
			data = bytes.Clone(data)
			data[off] ^= 0xff
		}
		if err := os.WriteFile(path+suffix, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	name := "s.db" + flipSuffixes[file]
	var d *DB
	defer func() {
		if v := recover(); v != nil {
			outcome, why = flipFail, fmt.Sprintf("panic: %v", v)
		}
		if d != nil {
			_ = d.Close()
		}
	}()
	rep, err := Check(path, flipOpts)
	if err != nil {
		return flipFail, fmt.Sprintf("Check = %v, want a report", err)
	}
	d, err = Open(path, flipOpts)
	if err != nil {
		var ce *CorruptError
		switch {
		case !errors.As(err, &ce):
			return flipFail, fmt.Sprintf("Open = %v, want a *CorruptError", err)
		case ce.File != name:
			return flipFail, fmt.Sprintf("Open = %v, naming %s, not %s", err, ce.File, name)
		}
		return flipRefused, ""
	}
	// One read of everything; each record read wrong is read again
	// alone, and must fail with ErrCorrupt.
	var wrong []int
	err = d.View(func(sn *Snapshot) error {
		for i, w := range s.want {
			if v := sn.Get(s.wantB[i], w[0]); !bytes.Equal(v, w[1]) || (v == nil) != (w[1] == nil) {
				wrong = append(wrong, i)
			}
		}
		return nil
	})
	if len(wrong) == 0 && err == nil {
		return flipIntact, ""
	}
	if err == nil || !errors.Is(err, ErrCorrupt) {
		i := wrong[0]
		return flipFail, fmt.Sprintf("bucket %s key %q read without error (View = %v): %s", flipOpts.Buckets[s.wantB[i]].Name, s.want[i][0], err, s.misread(d, i))
	}
	for _, i := range wrong {
		var v []byte
		err := d.View(func(sn *Snapshot) error {
			v = bytes.Clone(sn.Get(s.wantB[i], s.want[i][0]))
			return nil
		})
		if !errors.Is(err, ErrCorrupt) {
			return flipFail, fmt.Sprintf("bucket %s key %q = %q, %v; want %q or a corruption", flipOpts.Buckets[s.wantB[i]].Name, s.want[i][0], clip(v), err, clip(s.want[i][1]))
		}
	}
	if rep.OK() {
		return flipFail, fmt.Sprintf("reads fail (%v) but Check reports nothing", err)
	}
	for {
		st, err := d.Scrub(1000)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				return flipFail, fmt.Sprintf("Scrub = %v, want a corruption", err)
			}
			return flipDetected, ""
		}
		if st.Wrapped {
			return flipFail, "reads fail but a scrub pass finds nothing"
		}
	}
}

// misread says what record i reads as.
func (s *flipStore) misread(d *DB, i int) string {
	var v []byte
	err := d.View(func(sn *Snapshot) error {
		v = bytes.Clone(sn.Get(s.wantB[i], s.want[i][0]))
		return nil
	})
	return fmt.Sprintf("alone it reads %q, %v; want %q", clip(v), err, clip(s.want[i][1]))
}

func clip(b []byte) []byte {
	if len(b) > 40 {
		return append(bytes.Clone(b[:40]), "..."...)
	}
	return b
}
