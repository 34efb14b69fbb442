package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"

	bolt "go.etcd.io/bbolt"
)

// maxProblems bounds the problems a Report lists; the rest are counted.
const maxProblems = 100

// Report is what Check or Repair found in a store's files.
type Report struct {
	// Problems are the damage found, in the order met. A healthy store
	// has none.
	Problems []Problem
	// Omitted counts the problems found past the first hundred.
	Omitted int
	// Trimmed is a torn record at the end of the newest log generation:
	// an append that a crash cut short, never acknowledged. It is not a
	// problem: Open leaves it out by itself.
	Trimmed *Trim
	// Drops are the log records a repair cuts (Check) or cut (Repair):
	// every record from the damage on, of its generation and of the one
	// after it. Nil when the log is whole.
	Drops []Drop
	// Repairable says that every problem is damage in the log, which
	// Repair can cut back to the last good record.
	Repairable bool
	// Repaired says that Repair cut the log: Open now succeeds, without
	// the records in Drops.
	Repaired bool
}

// OK reports whether the files are healthy: no problems found.
func (r Report) OK() bool { return len(r.Problems) == 0 && r.Omitted == 0 }

// Problem is one piece of damage.
type Problem struct {
	// File is the damaged file's base name.
	File string
	// Where says where in it: "record 17 at offset 20", "bucket
	// accounts key \"a\"", "meta pages"; empty for the whole file.
	Where string
	// What is what is wrong.
	What string
}

func (p Problem) String() string {
	s := p.File
	if p.Where != "" {
		s += " " + p.Where
	}
	return s + ": " + p.What
}

// Drop is a run of one log generation's records that a repair cuts: from
// the damaged record (index First, at Offset of File) to the generation's
// last record (Last). Once the next generation has started, its start
// record says which that is, so the records a truncated or zeroed file
// lost outright are counted too; in the newest generation it is the last
// whole record found after the damage. Record 0 of a generation is its
// start record, which holds no writes.
type Drop struct {
	File    string
	Gen     uint64
	First   uint32
	Last    uint32
	Records int   // Last − First + 1
	Offset  int64 // where the cut is
	Bytes   int64 // from Offset to the end of the last record dropped
	// Groups are the writes of the dropped records whose checksums
	// hold, in order, so that a plugin can say which of its operations
	// a repair loses. A damaged record's writes cannot be known.
	Groups [][]Write
}

// Write is one write of a logged group.
type Write struct {
	Bucket int // the bucket's index in Options.Buckets
	Key    []byte
	Value  []byte // nil for a deletion
	Delete bool
}

// Check verifies the store's files at path offline, without changing
// them: a walk of the bbolt file's pages read from its bytes, which
// names each damaged page ("page 12", "meta page 0") and never faults;
// if the pages are sound, bbolt's own consistency check of the file and
// the checksum of every value in every bucket; and the write-ahead log
// as Open would read it (see the package doc's Integrity). A meta page
// that fails its checksum is reported even though bbolt falls back to
// the other. Its Report lists each problem, and
// what Repair would drop. It fails with an error wrapping ErrLocked if a
// process holds the store open (after Options.LockTimeout), and with
// another error if the files cannot be read at all; damage is reported,
// not returned. Options.Buckets may be empty: the log's records are then
// checked against the most buckets a store can have. A file the store
// did not write fails it with an error wrapping ErrNotStore.
func Check(path string, opts Options) (Report, error) {
	ex, err := examine(path, opts)
	if err != nil {
		return Report{}, err
	}
	if ex.db != nil {
		defer func() { _ = ex.db.Close() }()
	}
	return ex.report, nil
}

// Repair cuts a damaged write-ahead log back to its last good record,
// after which Open succeeds, and reports what it dropped: every record
// of the damaged generation from the damage on, and the generation after
// it. An older generation that ends short of where the next one's start
// record says (a tail zeroed or cut off) is damaged where its run stops:
// Repair drops the records the start record says it held from there on,
// and the next generation. Those records were acknowledged to clients: a
// repair loses acknowledged writes, and is run only when an operator
// asks for it, with the store closed, having no backup to restore. It
// cuts by zeroing the log from the damage to the end of the file (and
// the next generation's file), then fdatasyncs.
//
// Damage elsewhere (a value or page of the bbolt file, its meta pages, a
// log file from another data dir or time, an older generation longer
// than the next one's start record says, a missing log file) cannot be
// cut away: Repair changes nothing and returns the report with an error
// wrapping ErrCorrupt that says to restore from a backup. A healthy
// store, or a torn tail (which Open trims by itself), is left alone.
func Repair(path string, opts Options) (Report, error) {
	ex, err := examine(path, opts)
	if err != nil {
		return Report{}, err
	}
	if ex.db != nil {
		// The shared lock of the read-only bbolt file is kept while the
		// log is cut, so that no store opens meanwhile.
		defer func() { _ = ex.db.Close() }()
	}
	rep := ex.report
	if rep.OK() {
		return rep, nil
	}
	if !rep.Repairable {
		return rep, &CorruptError{File: rep.Problems[0].File, Where: rep.Problems[0].Where, Problem: rep.Problems[0].What,
			Remedy: "this cannot be repaired by cutting the write-ahead log; restore the data dir from a backup"}
	}
	for _, c := range ex.cuts {
		if err := zeroFrom(c.path, c.off); err != nil {
			return rep, fmt.Errorf("repair store %s: %w", path, err)
		}
	}
	rep.Repaired = true
	return rep, nil
}

// Inspect runs fn on the state the store's files hold, without changing
// them: the bbolt file under the log's groups up to its last good record
// (what Open gives, or Open after Repair if the log is damaged). It
// fails as Check does, and with a *CorruptError if the bbolt file is
// damaged. Options.Buckets must be the store's.
func Inspect(path string, opts Options, fn func(*Snapshot) error) error {
	if len(opts.Buckets) == 0 {
		return fmt.Errorf("inspect store %s: no buckets", path)
	}
	ex, err := examine(path, opts)
	if err != nil {
		return err
	}
	defer func() {
		if ex.db != nil {
			_ = ex.db.Close()
		}
	}()
	if ex.db == nil || !ex.boltOK || !ex.report.OK() && !ex.report.Repairable {
		return fmt.Errorf("inspect store %s: %w", path, ex.boltErr())
	}
	d := ex.db
	d.ov = newOverlay(0, len(d.buckets))
	for _, g := range ex.groups {
		d.ov.add(g)
	}
	return d.guard(func() error { return d.Scan(fn) })
}

// examination is what examine found.
type examination struct {
	db     *DB // read-only, nil if the file could not be opened
	report Report
	boltOK bool
	groups [][]entry // the log's groups up to its last good record
	cuts   []cutAt
	// notStore is the error of a file the store did not write.
	notStore error
}

// cutAt is where Repair zeroes a log file from.
type cutAt struct {
	path string
	off  int64
}

func (ex *examination) problem(p Problem) {
	if len(ex.report.Problems) >= maxProblems {
		ex.report.Omitted++
		return
	}
	ex.report.Problems = append(ex.report.Problems, p)
}

func (ex *examination) boltErr() error {
	for _, p := range ex.report.Problems {
		return &CorruptError{File: p.File, Where: p.Where, Problem: p.What, Remedy: "restore the data dir from a backup"}
	}
	return ErrCorrupt
}

// examine opens the store's bbolt file read-only and checks it and its
// log.
func examine(path string, opts Options) (*examination, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("check store: %w", err)
	}
	ex := &examination{}
	opts.readOnly = true
	d := &DB{path: path, name: filepath.Base(path), opts: opts}
	for _, b := range opts.Buckets {
		d.buckets = append(d.buckets, []byte(b.Name))
		d.seqb = append(d.seqb, b.Sequential)
	}
	db, err := d.openBolt()
	var ce *CorruptError
	switch {
	case errors.As(err, &ce):
		ex.problem(Problem{File: ce.File, Where: ce.Where, What: ce.Problem})
		return ex, nil
	case err != nil:
		return nil, fmt.Errorf("check store: %w", err)
	}
	d.db = db
	ex.db = d
	lay, ok := ex.checkBolt(d)
	if ex.notStore != nil {
		_ = db.Close()
		return nil, fmt.Errorf("check store %s: %w", path, ex.notStore)
	}
	ex.boltOK = ok
	if ok {
		ex.checkLog(d, lay)
	}
	// Only damage in the log can be cut away.
	ex.report.Repairable = ok && ex.report.Drops != nil
	return ex, nil
}

// checkBolt walks the file's pages (pages.go), then runs bbolt's
// consistency check and checks every value's checksum. It reports whether the file holds no damage.
func (ex *examination) checkBolt(d *DB) (lay layout, ok bool) {
	n := len(ex.report.Problems) + ex.report.Omitted
	// bbolt's tx.Check walks the tree in a goroutine of its own, where a
	// damaged page id faults and kills the process: only a tree that the
	// walk of its bytes found sound is let at it.
	if !ex.walk(d) {
		return lay, false
	}
	// Pages past the end of a truncated file fault rather than panic.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	err := d.db.View(func(tx *bolt.Tx) error {
		err := d.guard(func() (err error) {
			lay, err = d.readLayout(tx)
			return err
		})
		var ce *CorruptError
		switch {
		case errors.Is(err, ErrNotStore):
			ex.notStore = err
			return nil
		case err != nil:
			if errors.As(err, &ce) {
				ex.problem(Problem{File: d.name, Where: ce.Where, What: ce.Problem})
			} else {
				ex.problem(Problem{File: d.name, Where: "bucket store", What: err.Error()})
			}
		}
		for err := range tx.Check() {
			ex.problem(Problem{File: d.name, What: "bbolt check: " + err.Error()})
		}
		if err := d.guard(func() error {
			return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
				if bytes.Equal(name, bucketStore) {
					return nil
				}
				var got bucketSum
				whole := true
				err := b.ForEach(func(k, fv []byte) error {
					if fv == nil {
						whole = false
						ex.problem(Problem{File: d.name, Where: fmt.Sprintf("bucket %s key %q", name, k), What: "a nested bucket, which the store never writes"})
						return nil
					}
					if _, ok := unframe(k, fv); !ok {
						whole = false
						ex.problem(Problem{File: d.name, Where: fmt.Sprintf("bucket %s key %q", name, k), What: "checksum mismatch"})
						return nil
					}
					got.add(fv)
					return nil
				})
				if err != nil || !whole || lay.sums == nil {
					return err
				}
				if m := lay.sums[string(name)].mismatch(got); m != "" {
					ex.problem(Problem{File: d.name, Where: fmt.Sprintf("bucket %s", name), What: m})
				}
				return nil
			})
		}); err != nil {
			var ce *CorruptError
			if errors.As(err, &ce) {
				ex.problem(Problem{File: d.name, What: ce.Problem})
			} else {
				ex.problem(Problem{File: d.name, What: err.Error()})
			}
		}
		return nil
	})
	if err != nil {
		ex.problem(Problem{File: d.name, What: err.Error()})
	}
	return lay, len(ex.report.Problems)+ex.report.Omitted == n
}

// checkLog reads the write-ahead log as Open would, without opening its
// files for writing, and on damage works out what a repair cuts.
func (ex *examination) checkLog(d *DB, lay layout) {
	if !lay.open {
		// Closed cleanly, or never opened: Open needs nothing of the log.
		return
	}
	nb := len(d.buckets)
	if nb == 0 {
		nb = walMaxBuckets
	}
	for _, p := range []string{walPath(d.path, lay.gen), walPath(d.path, lay.gen+1)} {
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			ex.problem(Problem{File: filepath.Base(p), What: "missing: the store file was not closed cleanly, and this write-ahead log may hold its last committed groups"})
			return
		}
	}
	var data [2][]byte
	for i := range data {
		b, err := os.ReadFile(d.path + walSuffixes[i])
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			ex.problem(Problem{File: d.name + walSuffixes[i], What: err.Error()})
			return
		}
		data[i] = b
	}
	runs, v := analyzeWAL(d.path, data, lay.gen, nb)
	if v.err == nil {
		for _, r := range runs {
			ex.groups = append(ex.groups, r.groups...)
		}
		ex.report.Trimmed = v.trim
		return
	}
	ex.problem(Problem{File: v.err.File, Where: v.err.Where, What: v.err.Problem})
	ex.planCut(d.path, runs, v.cut, nb)
}

// planCut works out what cutting the log where analyzeWAL found the
// damage (run cut; -1 if a cut cannot repair it) drops: the run's records
// from its stop on and, when the run is the older generation's, all of
// the next one's, which were written after the records lost.
func (ex *examination) planCut(path string, runs [2]genRun, cut, nb int) {
	if cut < 0 {
		return
	}
	r := &runs[cut]
	for _, s := range runs[:cut+1] {
		ex.groups = append(ex.groups, s.groups...)
	}
	// The next generation's start record says how many records the older
	// one held: those a truncated or zeroed file lost outright count too.
	var known *walEnd
	if cut == 0 && runs[1].prev != nil {
		known = runs[1].prev
	}
	ex.report.Drops = append(ex.report.Drops, dropFrom(path, r.data, r.gen, r.end.records, int(r.end.off), nb, known))
	ex.cuts = append(ex.cuts, cutAt{path: walPath(path, r.gen), off: r.end.off})
	if n := &runs[1]; cut == 0 && !n.absent && (n.end.records > 0 || !n.clean || n.later >= 0) {
		ex.report.Drops = append(ex.report.Drops, dropFrom(path, n.data, n.gen, 0, 0, nb, nil))
		ex.cuts = append(ex.cuts, cutAt{path: walPath(path, n.gen), off: 0})
	}
}

// dropFrom describes the records of generation gen in data from the
// damaged one, index first at off, on: the whole records found after it,
// with increasing indexes, and up to known's last record if the next
// generation's start record says where the generation ends.
func dropFrom(path string, data []byte, gen uint64, first uint32, off int, nb int, known *walEnd) Drop {
	dr := Drop{File: filepath.Base(walPath(path, gen)), Gen: gen, First: first, Last: first, Offset: int64(off)}
	var g [8]byte
	binary.BigEndian.PutUint64(g[:], gen)
	next, end := first, off
	for from := off + walHeader; from < len(data); {
		i := bytes.Index(data[from:], g[:])
		if i < 0 {
			break
		}
		at := from + i - walHeader
		body, ok := nextRecord(data[at:])
		if !ok || binary.BigEndian.Uint64(body) != gen || binary.BigEndian.Uint32(body[8:]) < next {
			from += i + 1
			continue
		}
		idx := binary.BigEndian.Uint32(body[8:])
		if payload := body[walRecordHead:]; len(payload) == 0 || payload[0] != walStart {
			// A start record holds no writes.
			if es, err := decodeEntries(payload, nb); err == nil {
				dr.Groups = append(dr.Groups, writesOf(es))
			}
		}
		dr.Last, next = idx, idx+1
		end = at + walHeader + len(body)
		from = end + walHeader
	}
	if known != nil && known.records > 0 && known.records-1 > dr.Last {
		dr.Last = known.records - 1
		end = max(end, int(known.off))
	}
	dr.Records = int(dr.Last-dr.First) + 1
	if end > off {
		dr.Bytes = int64(end - off)
	} else {
		dr.Bytes = nonZero(data[min(off, len(data)):])
	}
	return dr
}

// writesOf returns the writes of es to buckets; the sequence counter's
// entry is not one.
func writesOf(es []entry) []Write {
	ws := make([]Write, 0, len(es))
	for _, e := range es {
		if e.b == entrySeq {
			continue
		}
		w := Write{Bucket: e.b, Key: e.k, Value: e.v, Delete: e.del}
		if e.del {
			w.Value = nil
		}
		ws = append(ws, w)
	}
	return ws
}

// zeroFrom zeroes the file at path from off to its end, in place, and
// waits until that is on disk. Zeroing rather than truncating keeps the
// file's blocks, as the log's erase does.
func zeroFrom(path string, off int64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("cut write-ahead log: %w", err)
	}
	fi, err := f.Stat()
	if err == nil && fi.Size() > off {
		_, err = f.WriteAt(make([]byte, fi.Size()-off), off)
	}
	if err == nil {
		err = fdatasync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cut write-ahead log %s at %d: %w", filepath.Base(path), off, err)
	}
	return nil
}

// walk reports the damage the walk of the bbolt file's pages finds, and
// whether bbolt may walk its tree: a damaged meta page that bbolt falls
// back from is reported, but leaves the tree bbolt reads sound.
func (ex *examination) walk(d *DB) bool {
	w, err := walkBoltFile(d.path, false)
	if err != nil {
		ex.problem(Problem{File: d.name, What: err.Error()})
		return false
	}
	for _, p := range w.problems {
		ex.problem(Problem{File: d.name, Where: p.where, What: p.what})
	}
	ex.report.Omitted += w.omitted
	return !w.structural()
}
