package ledger

import (
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
// the value (the same). Each generation starts at offset 0 of its file:
// once the file has grown to the size a generation needs, appends
// overwrite bytes in place and an fdatasync writes only data, not the
// file's size. A generation is started only once the one before the
// previous is in the bbolt file, so it overwrites nothing still needed.
//
// Replay reads, for the generation G the bbolt file names (meta
// "wal_gen") and for G+1, the records at the start of the file that
// begins with that generation, for as long as each is whole, has a valid
// checksum, belongs to the generation and has the next index. Whatever
// follows (a torn tail, records of an older generation) is not part of
// the log. Records of G+1 exist only once every record of G was on disk.
const (
	walHeader     = 8       // length and checksum
	walRecordHead = 8 + 4   // gen and index
	walDelete     = 0x80    // in an entry's first byte
	walMaxRecord  = 1 << 30 // larger lengths are garbage, not records
)

// walBuckets are the buckets in the order of their numbers in entries.
var walBuckets = [...][]byte{bucketMeta, bucketAccounts, bucketReceipts, bucketIdem, bucketIdemExp}

const (
	bMeta = iota
	bAccounts
	bReceipts
	bIdem
	bIdemExp
	numBuckets
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
// ledger's writer lock guards it.
type wal struct {
	files [2]*os.File // by generation parity
	f     *os.File    // files[gen%2]
	gen   uint64
	index uint32
	off   int64 // where the next record goes
	buf   []byte
	sync  func(*os.File) error // fdatasync; tests make it fail
}

// walSuffixes are the names of the log's files after the ledger's path,
// by generation parity.
var walSuffixes = [2]string{".wal", ".wal.1"}

// walPath returns the path of the log file that holds generation gen.
func walPath(path string, gen uint64) string { return path + walSuffixes[gen%2] }

// openWAL opens or creates the log files of the ledger at path and
// returns them with the records they hold of generations gen and gen+1,
// in order; gen 0 is a ledger that never had a log, for which it returns
// none.
func openWAL(path string, gen uint64) (*wal, [][]entry, error) {
	w := &wal{sync: fdatasync}
	var data [2][]byte
	for i := range w.files {
		f, err := os.OpenFile(path+walSuffixes[i], os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			_ = w.close()
			return nil, nil, fmt.Errorf("open write-ahead log: %w", err)
		}
		w.files[i] = f
		if data[i], err = io.ReadAll(f); err != nil {
			_ = w.close()
			return nil, nil, fmt.Errorf("read write-ahead log: %w", err)
		}
	}
	// The files' names must be durable before anything in them is; a
	// crash may have come between creating them and syncing their
	// directory before.
	if err := syncDir(filepath.Dir(path)); err != nil {
		_ = w.close()
		return nil, nil, fmt.Errorf("open write-ahead log: sync its directory: %w", err)
	}
	if gen == 0 {
		// Files left by another ledger (its bbolt file deleted, say):
		// their first records must not pass for this one's later, as a
		// log newer than the file, so their headers are zeroed.
		for i, f := range w.files {
			if len(data[i]) == 0 {
				continue
			}
			if _, err := f.WriteAt(make([]byte, walHeader), 0); err != nil {
				_ = w.close()
				return nil, nil, fmt.Errorf("clear write-ahead log %s: %w", path+walSuffixes[i], err)
			}
			if err := w.sync(f); err != nil {
				_ = w.close()
				return nil, nil, fmt.Errorf("clear write-ahead log %s: %w", path+walSuffixes[i], err)
			}
		}
		return w, nil, nil
	}
	for i, d := range data {
		if g, ok := firstGen(d); ok && g > gen+1 {
			// Checkpoints start a generation at offset 0 only once the
			// file names the one before it: a later one there means
			// the file is older than its log.
			_ = w.close()
			return nil, nil, fmt.Errorf("%w: the write-ahead log %s starts with generation %d, but the file only reached %d: the file is older than its log (were they restored from different times?)", ErrLogMismatch, path+walSuffixes[i], g, gen)
		}
	}
	var groups [][]entry
	for g := gen; g <= gen+1; g++ {
		for i, d := range data {
			first, ok := firstGen(d)
			if !ok || first != g {
				continue
			}
			gs, _, err := decodeWAL(d, g)
			if err != nil {
				_ = w.close()
				return nil, nil, fmt.Errorf("read write-ahead log %s: %w", path+walSuffixes[i], err)
			}
			groups = append(groups, gs...)
		}
	}
	return w, groups, nil
}

// decodeWAL returns the groups of generation gen at the start of data and
// the number of bytes they take. A record that is torn, fails its
// checksum or belongs elsewhere ends the log; an entry that does not
// decode inside a record whose checksum holds is an error, since that is
// not a torn write but a bug or a tampered file.
func decodeWAL(data []byte, gen uint64) ([][]entry, int, error) {
	var groups [][]entry
	off := 0
	for index := uint32(0); ; index++ {
		body, ok := nextRecord(data[off:])
		if !ok || binary.BigEndian.Uint64(body) != gen || binary.BigEndian.Uint32(body[8:]) != index {
			return groups, off, nil
		}
		es, err := decodeEntries(body[walRecordHead:])
		if err != nil {
			return nil, 0, fmt.Errorf("record %d at offset %d: %w", index, off, err)
		}
		groups = append(groups, es)
		off += walHeader + len(body)
	}
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

func decodeEntries(b []byte) ([]entry, error) {
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
// are copied: bbolt keeps what it is given until its transaction ends.
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

// append writes one record holding es and waits until it is on disk. On
// error the record is not part of the log: the next one overwrites it.
func (w *wal) append(es []entry) (int, error) {
	w.buf = appendRecord(w.buf[:0], w.gen, w.index, es)
	if n := len(w.buf) - walHeader; n > walMaxRecord {
		// Replay would take it for the end of the log.
		return 0, fmt.Errorf("write-ahead log: a group of %d bytes is over the %d a record may hold", n, walMaxRecord)
	}
	if _, err := w.f.WriteAt(w.buf, w.off); err != nil {
		return 0, fmt.Errorf("write-ahead log: %w", err)
	}
	if err := w.sync(w.f); err != nil {
		return 0, fmt.Errorf("write-ahead log: %w", err)
	}
	w.off += int64(len(w.buf))
	w.index++
	return len(w.buf), nil
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
	if _, err := w.f.WriteAt(make([]byte, walHeader), w.off); err != nil {
		return fmt.Errorf("erase write-ahead log record: %w", err)
	}
	if err := w.sync(w.f); err != nil {
		return fmt.Errorf("erase write-ahead log record: %w", err)
	}
	return nil
}

// reset starts generation gen at offset 0 of its file. The caller makes
// sure that the file's records are in the bbolt file.
func (w *wal) reset(gen uint64) {
	w.f, w.gen, w.index, w.off = w.files[gen%2], gen, 0, 0
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
