package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// The write-ahead log holds the groups committed since the last
// checkpoint, one record per group, in two files: path + ".wal" holds
// the even generations and path + ".wal.1" the odd ones. A generation is
// the run of groups between two checkpoints; a checkpoint starts the next
// generation in the other file and then writes its own into the bbolt
// file, so that groups go on committing meanwhile. A record is
//
//	length(4) crc32c(4) | gen(8) index(4) entries
//
// where the CRC-32C covers everything after it, gen is the record's
// generation and index counts the generation's records from 0. An entry
// is a byte with the bucket's number in the low bits and walDelete set
// for a deletion, then the key (uvarint length, bytes) and, for a put,
// the value (the same).
//
// Each generation starts at offset 0 of its file, whose first header is
// zeroed (and fdatasynced) when the generation starts; each append writes
// its record followed by a zero header, in one write, so the log always
// ends at a zero header or at a record torn by a crash. Once the file has
// grown to the size a generation needs, appends overwrite bytes in place
// and an fdatasync writes only data, not the file's size. A generation
// is started only once the one before the previous is in the bbolt file,
// so it overwrites nothing still needed.
//
// Replay reads, for the generation G the bbolt file names and for G+1,
// the records at the start of the file that holds that generation, for
// as long as each is whole, has a valid checksum, belongs to the
// generation and has the next index. Where that run stops tells a torn
// write from damage:
//
//   - a zero header is the end;
//   - anything else is a torn write only at the end of the newest
//     generation (a crash during its last, unacknowledged, append), and
//     is then trimmed: reported by Open, never replayed;
//   - a record of the same generation with a later index anywhere after
//     the stop (found by searching for the generation's 8 bytes, which
//     are random per store) proves that acknowledged records follow
//     the damage, and so does a stop in G while G+1 has records: Open
//     refuses with a *CorruptError naming the file, record and offset.
//
// A file written before the zero headers existed (the wallet's formats 3
// and 4, see Open) ends wherever its run stops, unless a later record of
// the generation proves damage.
const (
	walHeader     = 8       // length and checksum
	walRecordHead = 8 + 4   // gen and index
	walDelete     = 0x80    // in an entry's first byte
	walMaxRecord  = 1 << 30 // larger lengths are garbage, not records
	walMaxBuckets = 0x7f
)

// entry is one write of a group: a put of v under k in bucket b, or a
// deletion when del is set.
type entry struct {
	b   int
	del bool
	k   []byte
	v   []byte
}

// wal is the log's two files. It is not safe for concurrent use: the
// store's writer lock guards it.
type wal struct {
	path  string
	files [2]*os.File // by generation parity
	f     *os.File    // files[gen%2]
	gen   uint64
	index uint32
	off   int64 // where the next record goes
	buf   []byte
	sync  func(*os.File) error // fdatasync; tests make it fail
}

// walSuffixes are the names of the log's files after the store's path,
// by generation parity.
var walSuffixes = [2]string{".wal", ".wal.1"}

// walPath returns the path of the log file that holds generation gen.
func walPath(path string, gen uint64) string { return path + walSuffixes[gen%2] }

// Trim describes a torn record at the end of the log that Open left out:
// a group whose append never completed, so never acknowledged.
type Trim struct {
	File   string // base name of the log file
	Gen    uint64 // the generation
	Record uint32 // the torn record's index in its generation
	Offset int64  // where it starts
	Bytes  int64  // how many bytes after Offset are not zero
}

// walState is what openWAL found in the log.
type walState struct {
	groups [][]entry
	trim   *Trim
}

// openWAL opens or creates the log files of the store at path and returns
// them with the records they hold of generations gen and gen+1, in
// order. gen 0 is a store that never had a log, for which it replays
// nothing and clears what the files hold. strict says the files were
// written with zero headers after each record (see above).
func openWAL(path string, gen uint64, strict bool, numBuckets int, sync func(*os.File) error) (*wal, walState, error) {
	w := &wal{path: path, sync: sync}
	var data [2][]byte
	for i := range w.files {
		f, err := os.OpenFile(path+walSuffixes[i], os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			_ = w.close()
			return nil, walState{}, fmt.Errorf("open write-ahead log: %w", err)
		}
		w.files[i] = f
		if data[i], err = io.ReadAll(f); err != nil {
			_ = w.close()
			return nil, walState{}, fmt.Errorf("read write-ahead log: %w", err)
		}
	}
	// The files' names must be durable before anything in them is; a
	// crash may have come between creating them and syncing their
	// directory before.
	if err := syncDir(filepath.Dir(path)); err != nil {
		_ = w.close()
		return nil, walState{}, fmt.Errorf("open write-ahead log: sync its directory: %w", err)
	}
	if gen == 0 {
		// Files left by another store (its bbolt file deleted, say):
		// their first records must not pass for this one's later, so
		// their headers are zeroed.
		for i, f := range w.files {
			if len(data[i]) == 0 {
				continue
			}
			if err := w.zeroAt(f, 0); err != nil {
				_ = w.close()
				return nil, walState{}, err
			}
		}
		return w, walState{}, nil
	}
	st, err := replayWAL(path, data, gen, strict, numBuckets)
	if err != nil {
		_ = w.close()
		return nil, walState{}, err
	}
	return w, st, nil
}

// replayWAL reads generations gen and gen+1 from the files' contents
// (data[i] is the file of parity i).
func replayWAL(path string, data [2][]byte, gen uint64, strict bool, numBuckets int) (walState, error) {
	base := filepath.Base(path)
	// Which generation a file starts with tells whether it belongs here.
	for i, d := range data {
		g, ok := firstGen(d)
		if !ok {
			continue
		}
		name := base + walSuffixes[i]
		if strict {
			// A generation's file starts zeroed: only it, or (for the
			// generation after gen, if it never started) the one two
			// before it, can be there.
			own := gen
			if own%2 != uint64(i) {
				own = gen + 1
			}
			if g != own && g+2 != own {
				// Anything else cannot be this store's.
				return walState{}, &CorruptError{File: name, Where: "record 0 at offset 0",
					Problem: fmt.Sprintf("holds generation %d, but the store file needs generation %d there: a log from another data dir, or files restored from different times", g, own),
					Remedy:  "restore the data dir's files together from one backup"}
			}
		} else if g > gen+1 {
			return walState{}, &CorruptError{File: name, Where: "record 0 at offset 0",
				Problem: fmt.Sprintf("starts with generation %d, but the store file only reached %d: the file is older than its log", g, gen),
				Remedy:  "restore the data dir's files together from one backup"}
		}
	}
	var st walState
	type run struct {
		groups [][]entry
		stop   int
		index  uint32
		clean  bool // the run ends at a zero header or the end of the file
		ended  bool // the run ends at a whole zero header, as appends leave it
	}
	var runs [2]run
	for j := range runs {
		g := gen + uint64(j)
		d := data[g%2]
		name := base + walSuffixes[g%2]
		if first, ok := firstGen(d); ok && first != g {
			// The generation never started: the file holds older ones.
			runs[j] = run{clean: true, ended: true}
			continue
		}
		groups, stop, err := decodeWAL(d, g, numBuckets)
		if err != nil {
			return walState{}, &CorruptError{File: name, Where: err.where, Problem: err.problem, Remedy: remedy}
		}
		index := uint32(len(groups))
		runs[j] = run{groups: groups, stop: stop, index: index, clean: zeroHeader(d[stop:]),
			ended: len(d)-stop >= walHeader && zeroHeader(d[stop:])}
		if off, idx, ok := laterRecord(d, stop, g, index); ok {
			return walState{}, corruptf(name, fmt.Sprintf("record %d at offset %d", index, stop),
				"checksum mismatch or damaged header, and record %d of the same generation follows at offset %d: acknowledged writes come after the damage", idx, off)
		}
	}
	newest := 0
	if len(runs[1].groups) > 0 || !runs[1].clean {
		newest = 1
	}
	for j, r := range runs {
		g := gen + uint64(j)
		name := base + walSuffixes[g%2]
		if !strict {
			continue
		}
		// A generation the next one follows was ended by its last
		// append's zero header: a shorter end is a truncated file.
		if r.clean && (j != 0 || newest == 0 || r.ended) {
			continue
		}
		if j != newest {
			return walState{}, corruptf(name, fmt.Sprintf("record %d at offset %d", r.index, r.stop),
				"checksum mismatch or damaged header, and the next generation's records follow it in %s: acknowledged writes come after the damage", base+walSuffixes[(g+1)%2])
		}
		d := data[g%2]
		st.trim = &Trim{File: name, Gen: g, Record: r.index, Offset: int64(r.stop), Bytes: nonZero(d[r.stop:])}
	}
	for _, r := range runs {
		st.groups = append(st.groups, r.groups...)
	}
	return st, nil
}

// walError is an entry that does not decode inside a record whose
// checksum holds: not a torn write but a bug or a tampered file.
type walError struct{ where, problem string }

// decodeWAL returns the groups of generation gen at the start of data and
// the offset where their run stops: at a record that is torn, fails its
// checksum or belongs elsewhere.
func decodeWAL(data []byte, gen uint64, numBuckets int) ([][]entry, int, *walError) {
	var groups [][]entry
	off := 0
	for index := uint32(0); ; index++ {
		body, ok := nextRecord(data[off:])
		if !ok || binary.BigEndian.Uint64(body) != gen || binary.BigEndian.Uint32(body[8:]) != index {
			return groups, off, nil
		}
		es, err := decodeEntries(body[walRecordHead:], numBuckets)
		if err != nil {
			return nil, 0, &walError{where: fmt.Sprintf("record %d at offset %d", index, off), problem: err.Error()}
		}
		groups = append(groups, es)
		off += walHeader + len(body)
	}
}

// laterRecord looks after stop for a whole record of generation gen with
// an index of at least index, and returns its offset and index.
func laterRecord(data []byte, stop int, gen uint64, index uint32) (int, uint32, bool) {
	var g [8]byte
	binary.BigEndian.PutUint64(g[:], gen)
	from := stop + 1 + walHeader
	for from < len(data) {
		i := bytes.Index(data[from:], g[:])
		if i < 0 {
			return 0, 0, false
		}
		at := from + i - walHeader
		if body, ok := nextRecord(data[at:]); ok && binary.BigEndian.Uint64(body) == gen {
			if idx := binary.BigEndian.Uint32(body[8:]); idx >= index {
				return at, idx, true
			}
		}
		from += i + 1
	}
	return 0, 0, false
}

// zeroHeader reports whether b starts with a zero header, or holds fewer
// bytes than a header and all of them zero.
func zeroHeader(b []byte) bool {
	return nonZero(b[:min(len(b), walHeader)]) == 0
}

// nonZero returns how many bytes of b are not zero.
func nonZero(b []byte) int64 {
	var n int64
	for _, c := range b {
		if c != 0 {
			n++
		}
	}
	return n
}

// nextRecord returns the body (gen, index, entries) of the record at the
// start of data, if it is whole and its checksum holds.
func nextRecord(data []byte) ([]byte, bool) {
	if len(data) < walHeader {
		return nil, false
	}
	n := binary.BigEndian.Uint32(data)
	if n < walRecordHead || n > walMaxRecord || uint64(len(data)-walHeader) < uint64(n) {
		return nil, false
	}
	body := data[walHeader : walHeader+int(n)]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(data[4:]) {
		return nil, false
	}
	return body, true
}

func decodeEntries(b []byte, numBuckets int) ([]entry, error) {
	var es []entry
	for len(b) > 0 {
		e := entry{b: int(b[0] &^ walDelete), del: b[0]&walDelete != 0}
		if e.b >= numBuckets {
			return nil, fmt.Errorf("entry %d: bucket %d does not exist", len(es), e.b)
		}
		b = b[1:]
		var ok bool
		if e.k, b, ok = cutBytes(b); !ok || len(e.k) == 0 {
			return nil, fmt.Errorf("entry %d: bad key", len(es))
		}
		if !e.del {
			if e.v, b, ok = cutBytes(b); !ok {
				return nil, fmt.Errorf("entry %d: bad value", len(es))
			}
		}
		es = append(es, e)
	}
	return es, nil
}

// cutBytes splits a uvarint-length-prefixed byte string off b. The bytes
// are copied: the overlay keeps them after the file's buffer is gone.
func cutBytes(b []byte) (v, rest []byte, ok bool) {
	n, w := binary.Uvarint(b)
	if w <= 0 || n > uint64(len(b)-w) {
		return nil, nil, false
	}
	return append([]byte{}, b[w:w+int(n)]...), b[w+int(n):], true
}

// appendEntry appends e's encoding to b.
func appendEntry(b []byte, e entry) []byte {
	op := byte(e.b)
	if e.del {
		op |= walDelete
	}
	b = append(b, op)
	b = binary.AppendUvarint(b, uint64(len(e.k)))
	b = append(b, e.k...)
	if !e.del {
		b = binary.AppendUvarint(b, uint64(len(e.v)))
		b = append(b, e.v...)
	}
	return b
}

// append writes one record holding es, and the zero header after it, and
// waits until they are on disk. On error the record is not part of the
// log: the next one overwrites it.
func (w *wal) append(es []entry) (int, error) {
	w.buf = appendRecord(w.buf[:0], w.gen, w.index, es)
	n := len(w.buf)
	if n-walHeader > walMaxRecord {
		// Replay would take it for the end of the log.
		return 0, fmt.Errorf("write-ahead log: a group of %d bytes is over the %d a record may hold", n-walHeader, walMaxRecord)
	}
	w.buf = append(w.buf, make([]byte, walHeader)...)
	if _, err := w.f.WriteAt(w.buf, w.off); err != nil {
		return 0, fmt.Errorf("write-ahead log: %w", err)
	}
	if err := w.sync(w.f); err != nil {
		return 0, fmt.Errorf("write-ahead log: %w", err)
	}
	w.off += int64(n)
	w.index++
	return n, nil
}

// appendRecord appends the record of es, the index-th of generation gen,
// to b.
func appendRecord(b []byte, gen uint64, index uint32, es []entry) []byte {
	start := len(b)
	b = append(b, make([]byte, walHeader)...)
	b = binary.BigEndian.AppendUint64(b, gen)
	b = binary.BigEndian.AppendUint32(b, index)
	for _, e := range es {
		b = appendEntry(b, e)
	}
	body := b[start+walHeader:]
	binary.BigEndian.PutUint32(b[start:], uint32(len(body)))
	binary.BigEndian.PutUint32(b[start+4:], crc32.Checksum(body, castagnoli))
	return b
}

// erase zeroes the header where the next record goes, so that a record
// whose write or fdatasync failed, and may be on disk anyway, cannot be
// replayed: once the zeros are on disk, the log ends there. Zeroing in
// place rather than truncating keeps the file's blocks where they are: a
// block freed by a truncate could come back, after a crash, with the old
// record in it.
func (w *wal) erase() error {
	if err := w.zeroAt(w.f, w.off); err != nil {
		return fmt.Errorf("erase write-ahead log record: %w", err)
	}
	return nil
}

// zeroAt writes a zero header at off of f and waits until it is on disk.
func (w *wal) zeroAt(f *os.File, off int64) error {
	if _, err := f.WriteAt(make([]byte, walHeader), off); err != nil {
		return fmt.Errorf("zero write-ahead log %s at %d: %w", f.Name(), off, err)
	}
	if err := w.sync(f); err != nil {
		return fmt.Errorf("zero write-ahead log %s at %d: %w", f.Name(), off, err)
	}
	return nil
}

// reset starts generation gen at offset 0 of its file, whose first
// header it zeroes. The caller makes sure that the file's records are in
// the bbolt file.
func (w *wal) reset(gen uint64) error {
	f := w.files[gen%2]
	if err := w.zeroAt(f, 0); err != nil {
		return err
	}
	w.f, w.gen, w.index, w.off = f, gen, 0, 0
	return nil
}

func (w *wal) close() error {
	var errs []error
	for _, f := range w.files {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	return errors.Join(errs...)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if errors.Is(err, syscall.EINVAL) {
		err = nil // a file system that cannot sync directories (some FUSE and network mounts)
	}
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// firstGen returns the generation of the log's first record, if it is a
// whole record with a valid checksum.
func firstGen(data []byte) (uint64, bool) {
	body, ok := nextRecord(data)
	if !ok {
		return 0, false
	}
	return binary.BigEndian.Uint64(body), true
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)
