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
//	length(4) crc32c(4) | gen(8) index(4) payload
//
// where the CRC-32C covers everything after it, gen is the record's
// generation and index counts the generation's records from 0. Record 0
// is the generation's start record, whose payload is
//
//	0x7f records(4) end(8) last(4)
//
// naming where the generation before ended: how many records it holds
// (its start record included), the offset after its last record, and
// that record's checksum; all zero when the generation before is not in
// the log (a generation started by Open, after replaying the log into
// the bbolt file). Every later record is a group, whose payload is its
// entries: each a byte with the bucket's number in the low bits
// (never 0x7f: a store has at most 127 buckets) and walDelete set for a
// deletion, then the key (uvarint length, bytes) and, for a put, the
// value (the same). An entry whose byte is 0xff sets the store's
// sequence counter (Tx.NextSeq) to the 8 bytes after it; only groups that
// moved the counter hold one.
//
// A generation starts at offset 0 of its file with its start record and
// a zero header after it, in one write, fdatasynced before any group of
// the generation is written; each append writes its record followed by
// a zero header, in one write, so the log always ends at a zero header
// or at a record torn by a crash. A generation ends when the next one
// starts: a checkpoint starts it under the writers' lock, so the start
// record names the very end of the generation before, and no group is
// appended to that generation after it. Once the file has grown to the
// size a generation needs, appends overwrite bytes in place and an
// fdatasync writes only data, not the file's size. A generation is
// started only once the one before the previous is in the bbolt file, so
// it overwrites nothing still needed.
//
// Replay reads, for the generation G the bbolt file names and for G+1,
// the records at the start of the file that holds that generation, for
// as long as each is whole, has a valid checksum, belongs to the
// generation and has the next index. G+1 has not started if its file is
// empty, starts with a zero header (a repair cut it) or holds G-1 (a
// crash came before its start record was written): G is then the newest
// generation. Where the runs stop tells a torn write from damage:
//
//   - a record of the same generation with a later index anywhere after
//     a run's stop (found by searching for the generation's 8 bytes,
//     which are random per store) proves that acknowledged records follow
//     the damage: Open refuses with a *CorruptError naming the file,
//     record and offset;
//   - once G+1 has started with a whole start record, G's run must end
//     exactly where that record says. A shorter run lost acknowledged
//     records, whatever stops it: a zero header (a zeroed tail), the end
//     of the file (a truncated one) or a damaged record; Open refuses,
//     naming G's file and where its run stops. A longer run, or one that
//     ends elsewhere or with another last record, is not the G that G+1
//     followed (files restored from different times): Open refuses,
//     naming G+1's start record, and no repair can tell which is right;
//   - if G+1's file starts with a torn start record (neither a whole
//     record nor a zero header, and no record of G+1 follows), a crash
//     cut short the checkpoint that started it: G+1 holds no group, and
//     G is the newest generation that does. G's length cannot be checked
//     then, since what was torn is the record of it, but G's last append
//     left a zero header: a G that stops anywhere else is damage,
//     refused. The torn start record is trimmed;
//   - otherwise a run ends at a zero header. Anything else that stops
//     the newest generation's run after its start record is either a
//     write torn by a crash or a damaged acknowledged record, told apart
//     by what a crash can leave (damagedLast): the file ending before the
//     record's declared end, or the record zero from a sector boundary to
//     its end, is torn; a record whole in the file that fails its
//     checksum with no such zero tail is damage, refused naming the file,
//     record and offset, and Repair drops it. What stops the run at its
//     start record (a torn start record, or its zero header not written
//     over an older generation's bytes) is torn. A torn write is trimmed,
//     reported by Open, never replayed.
//
// The rule for the newest generation's last record, and why: each append
// is fdatasynced before its group is acknowledged, and the append before
// it left a zero header, fdatasynced, where it starts. So the only record
// a crash can leave incomplete is the last, unacknowledged one, and only
// as a crash writes: a device writes a 512-byte sector whole or not at
// all, and a file system may extend the file before the data lands,
// which leaves the file short or the record's unwritten sectors zero. A
// crash does not flip bits in a record whole in the file, so such a
// record was written, and a group written is taken as acknowledged: it
// is refused, not trimmed (as TigerBeetle never takes a damaged record
// for a torn write). The rule errs towards refusing: a power loss during
// an append that overwrites an older generation's bytes in place can
// leave those bytes, not zeros, under the record's tail, and Open refuses
// that unacknowledged record as damage until check -repair drops it. A
// kill -9 tears nothing: the page cache holds the whole write.
//
// The newest generation's end is recorded nowhere, so some damage to it
// still passes for a crash: a tail of it zeroed from a record boundary on
// looks like its end, a last record zeroed from a sector boundary on, or
// one whose length field was damaged to reach past the end of the file,
// looks torn.
const (
	walHeader     = 8       // length and checksum
	walRecordHead = 8 + 4   // gen and index
	walDelete     = 0x80    // in an entry's first byte
	walMaxRecord  = 1 << 30 // larger lengths are garbage, not records
	walMaxBuckets = 0x7f
	walStart      = 0x7f                   // a start record's first payload byte
	walSeq        = walDelete | walStart   // an entry that sets the sequence counter
	walStartBody  = walRecordHead + 1 + 16 // a start record's body
)

// entry is one write of a group: a put of v under k in bucket b, or a
// deletion when del is set; or, when b is entrySeq, the sequence
// counter's new value, 8 bytes in v.
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
	off   int64  // where the next record goes
	last  uint32 // the checksum of the generation's last record
	buf   []byte
	sync  func(*os.File) error // fdatasync; tests make it fail
}

// walEnd is where a generation ends: how many records it holds, its
// start record included, the offset after its last record, and that
// record's checksum. A start record names the generation before's; the
// zero walEnd there says that generation is not in the log.
type walEnd struct {
	records uint32
	off     int64
	last    uint32
}

// entrySeq is the bucket number of an entry that sets the sequence
// counter.
const entrySeq = -1

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
	// started counts the generations read, gen and gen+1, that began:
	// their start record is in their file. Only a generation that began
	// can hold groups, and gen+1 begins only after gen.
	started int
}

// openWAL opens or creates the log files of the store at path and returns
// them with the records they hold of generations gen and gen+1, in
// order. gen 0 is a store that never had a log, for which it replays
// nothing and clears what the files hold.
func openWAL(path string, gen uint64, numBuckets int, sync func(*os.File) error) (*wal, walState, error) {
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
	st, err := replayWAL(path, data, gen, numBuckets)
	if err != nil {
		_ = w.close()
		return nil, walState{}, err
	}
	return w, st, nil
}

// replayWAL reads generations gen and gen+1 from the files' contents
// (data[i] is the file of parity i).
func replayWAL(path string, data [2][]byte, gen uint64, numBuckets int) (walState, error) {
	runs, v := analyzeWAL(path, data, gen, numBuckets)
	if v.err != nil {
		return walState{}, v.err
	}
	st := walState{trim: v.trim}
	for _, r := range runs {
		st.groups = append(st.groups, r.groups...)
		if !r.absent && r.end.records > 0 {
			st.started++
		}
	}
	return st, nil
}

// genRun is what the log holds of one of the two generations replay
// reads.
type genRun struct {
	walRun
	gen    uint64
	file   string // the log file's base name
	data   []byte
	bad    *walError // the run stops at a record whose checksum holds but whose payload does not decode
	absent bool      // the file starts with the generation two before: this one never started
	clean  bool      // the run stops at a zero header, or within zeros at the end of the file
	ended  bool      // the run stops at a whole zero header, as an append leaves it
	later  int       // the offset of a whole record of the generation with a later index after the stop; -1 if none
	next   uint32    // that record's index
}

// where names the record at which r stops.
func (r *genRun) where() string {
	return fmt.Sprintf("record %d at offset %d", r.end.records, r.end.off)
}

// walVerdict is what analyzeWAL decided.
type walVerdict struct {
	err *CorruptError // why Open refuses, nil if the log replays
	// cut is the run (0 for gen, 1 for gen+1) whose records from its
	// stop on a repair drops, with the whole next generation when it is
	// gen's; -1 when cutting the log cannot repair it.
	cut  int
	trim *Trim // the torn record Open leaves out
}

// analyzeWAL reads the runs of generations gen and gen+1 and decides, as
// the comment at the top of this file says, whether they replay, what a
// torn tail trims, or what damage refuses them.
func analyzeWAL(path string, data [2][]byte, gen uint64, numBuckets int) ([2]genRun, walVerdict) {
	base := filepath.Base(path)
	var runs [2]genRun
	// Which generation a file starts with tells whether it belongs here.
	for i, d := range data {
		g, ok := firstGen(d)
		if !ok {
			continue
		}
		// A generation's file starts with its start record: only it,
		// or (for the generation after gen, if it never started) the
		// one two before it, can be there.
		own := gen
		if own%2 != uint64(i) {
			own = gen + 1
		}
		if g != own && g+2 != own {
			// Anything else cannot be this store's.
			return runs, walVerdict{cut: -1, err: &CorruptError{File: base + walSuffixes[i], Where: "record 0 at offset 0",
				Problem: fmt.Sprintf("holds generation %d, but the store file needs generation %d there: a log from another data dir, or files restored from different times", g, own),
				Remedy:  restoreTogether}}
		}
	}
	for j := range runs {
		g := gen + uint64(j)
		d := data[g%2]
		r := genRun{gen: g, file: base + walSuffixes[g%2], data: d, later: -1}
		if first, ok := firstGen(d); ok && first != g {
			// The generation never started: the file holds older ones.
			r.absent, r.clean, r.ended = true, true, true
			runs[j] = r
			continue
		}
		r.walRun, r.bad = decodeWAL(d, g, numBuckets)
		stop := int(r.end.off)
		r.clean = zeroHeader(d[stop:])
		r.ended = r.clean && len(d)-stop >= walHeader
		if off, idx, ok := laterRecord(d, stop, g, r.end.records); ok && r.bad == nil {
			r.later, r.next = off, idx
		}
		runs[j] = r
	}
	return runs, judge(&runs)
}

// restoreTogether is the remedy for log files that do not belong with
// the store file or with each other.
const restoreTogether = "restore the data dir's files together from one backup"

// judge decides what the runs of generations G (runs[0]) and G+1 mean.
func judge(runs *[2]genRun) walVerdict {
	for j := range runs {
		r := &runs[j]
		if r.bad != nil {
			return walVerdict{cut: j, err: &CorruptError{File: r.file, Where: r.bad.where, Problem: r.bad.problem, Remedy: remedy}}
		}
		if r.later >= 0 {
			return walVerdict{cut: j, err: corruptf(r.file, r.where(),
				"checksum mismatch or damaged header, and record %d of the same generation follows at offset %d: acknowledged writes come after the damage", r.next, r.later)}
		}
	}
	v := walVerdict{cut: -1}
	older, newer := &runs[0], &runs[1]
	newest := older
	if newer.end.records > 0 || !newer.clean {
		newest = newer
	}
	switch p := newer.prev; {
	case newest == older:
		// G+1 never started, or a repair cut it.
	case p != nil && (older.absent || older.end.records > p.records || older.end.records == p.records && older.end != *p):
		return walVerdict{cut: -1, err: &CorruptError{File: newer.file, Where: "record 0 at offset 0",
			Problem: fmt.Sprintf("this start record says the generation before, in %s, holds %d records, to offset %d, but it holds %d, to offset %d: files restored from different times, or from different data dirs",
				older.file, p.records, p.off, older.end.records, older.end.off),
			Remedy: restoreTogether}}
	case p != nil && older.end.records < p.records:
		return walVerdict{cut: 0, err: corruptf(older.file, older.where(),
			"%s, but the next generation's start record (%s record 0) says this generation holds %d records, to offset %d: acknowledged writes are missing",
			stopsAt(older.data, int(older.end.off)), newer.file, p.records, p.off)}
	case p == nil && !older.ended:
		// A crash cut G+1's start record short: G's last append left a
		// zero header.
		return walVerdict{cut: 0, err: corruptf(older.file, older.where(),
			"%s, where this generation's last append left a zero header, and the next generation has started after it in %s: acknowledged writes may be missing",
			stopsAt(older.data, int(older.end.off)), newer.file)}
	}
	if !newest.clean {
		stop := newest.end.off
		if newest.end.records > 0 {
			if problem := damagedLast(newest.data, int(stop)); problem != "" {
				cut := 0
				if newest == newer {
					cut = 1
				}
				return walVerdict{cut: cut, err: corruptf(newest.file, newest.where(), "%s", problem)}
			}
		}
		v.trim = &Trim{File: newest.file, Gen: newest.gen, Record: newest.end.records, Offset: stop, Bytes: nonZero(newest.data[stop:])}
	}
	return v
}

// walSector is the unit a torn write loses or keeps whole: a device
// writes a 512-byte sector entirely or not at all, and a file system
// extends a file by whole blocks, which are multiples of it.
const walSector = 512

// damagedLast says why the record at stop of data, where the newest
// generation's run stops after its start record, is damage and not a
// write torn by a crash; "" if it may be torn. The append before it
// left a zero header at stop, fdatasynced, so whatever is there now is
// the torn append's own header or that zero header. A torn append is
// one whose bytes did not all reach the disk: the file ends before the
// record's declared end, or the record's extent (its header alone, when
// the length is not one a record can have) ends in zeros from a sector
// boundary on, where the file system extended the file before the data
// landed. A record that is whole in the file and fails its checksum
// with no such zero tail is damage: a crash does not flip bits. A whole
// record with a valid checksum is an older generation's, left where a
// torn start record's zero header did not land.
func damagedLast(data []byte, stop int) string {
	if len(data)-stop < walHeader {
		return ""
	}
	if _, ok := nextRecord(data[stop:]); ok {
		// A whole record of another generation or index: the bytes
		// an older generation left where the zero header belongs.
		return ""
	}
	n := binary.BigEndian.Uint32(data[stop:])
	extent := walHeader
	if n >= walRecordHead && n <= walMaxRecord {
		if uint64(len(data)-stop-walHeader) < uint64(n) {
			return "" // the file ends inside the record
		}
		extent += int(n)
	}
	end := stop + extent
	for a := (stop/walSector + 1) * walSector; a < end; a += walSector {
		if nonZero(data[a:end]) == 0 {
			return ""
		}
	}
	if extent == walHeader {
		return fmt.Sprintf("damaged header (length %d) after this generation's last good record, and not the zero tail or short file a crash leaves: an acknowledged write may be lost", n)
	}
	return fmt.Sprintf("checksum mismatch in the generation's last record, %d bytes long and whole in the file, and not the zero tail or short file a crash leaves: an acknowledged write is damaged", extent)
}

// stopsAt says what stops a run at off of data.
func stopsAt(data []byte, off int) string {
	switch {
	case off >= len(data):
		return "the file ends here"
	case zeroHeader(data[off:]):
		return "zeroed from here"
	default:
		return "checksum mismatch or damaged header"
	}
}

// walError is a record whose checksum holds but whose payload does not
// decode, or does not belong where it is: not a torn write but a bug or
// a tampered file.
type walError struct{ where, problem string }

// walRun is the run of a generation's records at the start of its file.
type walRun struct {
	groups [][]entry
	prev   *walEnd // what the start record says of the generation before; nil without one
	end    walEnd  // where the run stops
}

// decodeWAL returns the run of generation gen's records at the start of
// data: it stops at a record that is torn, fails its checksum or belongs
// elsewhere, and at a record whose payload does not decode, which it
// returns as a walError.
func decodeWAL(data []byte, gen uint64, numBuckets int) (walRun, *walError) {
	var r walRun
	for {
		off, index := int(r.end.off), r.end.records
		body, ok := nextRecord(data[off:])
		if !ok || binary.BigEndian.Uint64(body) != gen || binary.BigEndian.Uint32(body[8:]) != index {
			return r, nil
		}
		payload := body[walRecordHead:]
		isStart := len(payload) > 0 && payload[0] == walStart
		var problem string
		switch {
		case isStart && index != 0:
			problem = "a start record where a group belongs"
		case !isStart && index == 0:
			problem = "a group where the generation's start record belongs"
		case isStart:
			if prev, ok := decodeStart(body); ok {
				r.prev = &prev
			} else {
				problem = fmt.Sprintf("a start record of %d bytes, want %d", len(body), walStartBody)
			}
		default:
			if es, err := decodeEntries(payload, numBuckets); err == nil {
				r.groups = append(r.groups, es)
			} else {
				problem = err.Error()
			}
		}
		if problem != "" {
			return r, &walError{where: fmt.Sprintf("record %d at offset %d", index, off), problem: problem}
		}
		r.end = walEnd{records: index + 1, off: int64(off + walHeader + len(body)), last: binary.BigEndian.Uint32(data[off+4:])}
	}
}

// decodeStart returns what the start record whose body is b names.
func decodeStart(b []byte) (walEnd, bool) {
	if len(b) != walStartBody || b[walRecordHead] != walStart {
		return walEnd{}, false
	}
	b = b[walRecordHead+1:]
	return walEnd{
		records: binary.BigEndian.Uint32(b),
		off:     int64(binary.BigEndian.Uint64(b[4:])),
		last:    binary.BigEndian.Uint32(b[12:]),
	}, true
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
		if b[0] == walSeq {
			if len(b) < 9 {
				return nil, fmt.Errorf("entry %d: bad sequence number", len(es))
			}
			es = append(es, entry{b: entrySeq, v: bytes.Clone(b[1:9])})
			b = b[9:]
			continue
		}
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
	if e.b == entrySeq {
		return append(append(b, walSeq), e.v...)
	}
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
	w.last = binary.BigEndian.Uint32(w.buf[4:])
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
	seal(b[start:])
	return b
}

// appendStart appends the start record of generation gen, naming prev,
// to b.
func appendStart(b []byte, gen uint64, prev walEnd) []byte {
	start := len(b)
	b = append(b, make([]byte, walHeader)...)
	b = binary.BigEndian.AppendUint64(b, gen)
	b = binary.BigEndian.AppendUint32(b, 0)
	b = append(b, walStart)
	b = binary.BigEndian.AppendUint32(b, prev.records)
	b = binary.BigEndian.AppendUint64(b, uint64(prev.off))
	b = binary.BigEndian.AppendUint32(b, prev.last)
	seal(b[start:])
	return b
}

// seal fills in the header of the record that is rec: its body's length
// and checksum.
func seal(rec []byte) {
	body := rec[walHeader:]
	binary.BigEndian.PutUint32(rec, uint32(len(body)))
	binary.BigEndian.PutUint32(rec[4:], crc32.Checksum(body, castagnoli))
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

// start begins generation gen at offset 0 of its file: it writes the
// generation's start record, naming prev as the end of the generation
// before, with a zero header after it, and waits until they are on disk.
// The caller makes sure that the file's records are in the bbolt file.
// On error the log stays in its generation, but the start record may be
// on disk anyway: the caller erases it (unstart) before another group
// goes to the log, or the start record would name an end that later
// groups moved.
func (w *wal) start(gen uint64, prev walEnd) error {
	f := w.files[gen%2]
	w.buf = appendStart(w.buf[:0], gen, prev)
	n := len(w.buf)
	last := binary.BigEndian.Uint32(w.buf[4:])
	w.buf = append(w.buf, make([]byte, walHeader)...)
	if _, err := f.WriteAt(w.buf, 0); err != nil {
		return fmt.Errorf("start write-ahead log generation %d: %w", gen, err)
	}
	if err := w.sync(f); err != nil {
		return fmt.Errorf("start write-ahead log generation %d: %w", gen, err)
	}
	w.f, w.gen, w.index, w.off, w.last = f, gen, 1, int64(n), last
	return nil
}

// unstart zeroes the header of generation gen's start record, whose
// write failed: once the zeros are on disk, the generation never
// started.
func (w *wal) unstart(gen uint64) error {
	if err := w.zeroAt(w.files[gen%2], 0); err != nil {
		return fmt.Errorf("erase write-ahead log start record: %w", err)
	}
	return nil
}

// end returns where the log's current generation ends now.
func (w *wal) end() walEnd { return walEnd{records: w.index, off: w.off, last: w.last} }

func (w *wal) close() error {
	var errs []error
	for _, f := range w.files {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	return errors.Join(errs...)
}

func syncDir(dir string) error { return syncDirWith(dir, (*os.File).Sync) }

// syncDirWith syncs the directory dir with sync.
func syncDirWith(dir string, sync func(*os.File) error) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = sync(d)
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
