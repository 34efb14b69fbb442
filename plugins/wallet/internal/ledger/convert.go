package ledger

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime/debug"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/plughost/plughost/sdk/store"
)

// The wallet's release before the store kept the ledger in a bbolt file
// of its own layout, the same buckets as now with values unframed, and
// its format in meta "format": 1 and 2 after a clean Close (2 once an
// idempotency record referred to a receipt), 3 while open with a
// write-ahead log in path + ".wal", 4 while open with a log in
// path + ".wal" and ".wal.1". The log's generation was meta "wal_gen".
// Open converts such a file into a store (store.Import) and leaves
// formatGuard under meta "format", which that release refuses rather
// than misread the store.
const (
	formatWAL   = 3
	formatLogs  = 4
	formatGuard = 5
)

var (
	keyFormat = []byte("format")
	keyWALGen = []byte("wal_gen")
)

// oldFile is what a file of the release before the store says of
// itself.
type oldFile struct {
	format, gen uint64
}

// readOldFile reads the layout of a file of the release before the
// store from its meta bucket.
func readOldFile(tx *bolt.Tx) (oldFile, error) {
	meta := tx.Bucket([]byte(buckets[bMeta].Name))
	var v []byte
	if meta != nil {
		v = meta.Get(keyFormat)
	}
	if len(v) != 8 || binary.BigEndian.Uint64(v) < 1 || binary.BigEndian.Uint64(v) > formatLogs {
		return oldFile{}, fmt.Errorf("file format %x is not one of 1 to %d, nor a store's", v, formatLogs)
	}
	f := oldFile{format: binary.BigEndian.Uint64(v)}
	if f.format >= formatWAL {
		f.gen = getU64(meta, keyWALGen)
	}
	return f, nil
}

// convert converts the ledger file at path, and its write-ahead log, of
// the release before the store into a store, in one step (store.Import):
// a crash at any point leaves either the old files, which the next Open
// converts again, or the store. It holds the old file's lock meanwhile.
// It reports false, and converts nothing, if the file at path was
// converted by another process while this one waited for the lock.
func convert(path string, opts store.Options) (converted bool, err error) {
	// bbolt panics on some damaged pages, and faults on a page past the
	// file's end.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if v := recover(); v != nil {
			converted, err = false, &store.CorruptError{File: filepath.Base(path), Problem: fmt.Sprintf("a page cannot be read: %v", v),
				Remedy: "restore the data dir from a backup"}
		}
	}()
	var held *os.File
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout: cmp.Or(opts.LockTimeout, DefaultLockTimeout),
		// As that release opened it: no free list in the file, so
		// that opening it writes nothing.
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			held = f
			return f, err
		},
	})
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return false, fmt.Errorf("convert %s: %w: another process has it open", path, ErrLocked)
	case err != nil:
		return false, fmt.Errorf("convert %s: %v", path, err)
	}
	defer func() { _ = db.Close() }()
	if was, err := held.Stat(); err != nil {
		return false, fmt.Errorf("convert %s: %w", path, err)
	} else if now, err := os.Stat(path); err != nil || !os.SameFile(was, now) {
		return false, nil
	}
	err = db.View(func(tx *bolt.Tx) error {
		old, err := readOldFile(tx)
		if err != nil {
			return err
		}
		groups, err := readOldLog(path, old)
		if err != nil {
			return err
		}
		return store.Import(path, opts, func(ld *store.Loader) error { return load(ld, tx, groups) })
	})
	if err != nil {
		return false, fmt.Errorf("convert %s from the format of the release before the store: %w", path, err)
	}
	return true, nil
}

// load writes the old file's values, then the groups of its log, into
// the new store, and the guard against the release before.
func load(ld *store.Loader, tx *bolt.Tx, groups [][]store.Write) error {
	err := tx.ForEach(func(name []byte, b *bolt.Bucket) error {
		i := bucketIndex(name)
		if i < 0 {
			return fmt.Errorf("bucket %q is not one of the ledger's", name)
		}
		return b.ForEach(func(k, v []byte) error {
			switch {
			case v == nil:
				return fmt.Errorf("bucket %s key %q is a nested bucket, which the ledger never wrote", name, k)
			case i == bMeta && (bytes.Equal(k, keyFormat) || bytes.Equal(k, keyWALGen)):
				return nil // the old layout's, not the ledger's
			}
			return ld.Put(i, k, v)
		})
	})
	if err != nil {
		return err
	}
	for _, g := range groups {
		for _, w := range g {
			if w.Delete {
				err = ld.Delete(w.Bucket, w.Key)
			} else {
				err = ld.Put(w.Bucket, w.Key, w.Value)
			}
			if err != nil {
				return err
			}
		}
	}
	return ld.Put(bMeta, keyFormat, u64(formatGuard))
}

func bucketIndex(name []byte) int {
	for i, b := range buckets {
		if b.Name == string(name) {
			return i
		}
	}
	return -1
}

// The release before the store wrote its log as records of
//
//	length(4) crc32c(4) | gen(8) index(4) entries
//
// (the CRC-32C covering everything after it), each generation from
// offset 0 of its file with index 0, and nothing after a record: an
// entry is a byte with the bucket's number in the low bits and
// oldDelete set for a deletion, then the key (uvarint length, bytes)
// and, for a put, the value (the same). The format is frozen: this
// reader must not follow the store's log, which may change.
const (
	oldHeader    = 8
	oldBodyHead  = 8 + 4
	oldDelete    = 0x80
	oldMaxRecord = 1 << 30
	oldBuckets   = 5 // meta, accounts, receipts, idem, idem_exp
)

// readOldLog returns the groups that the old file's log holds and its
// bbolt file lacks, as that release replayed them: for generation
// old.gen and the one after it, the run of records at the start of the
// file that begins with that generation. A record of a run's generation
// past where the run stops proves damage, not a torn tail: it is
// refused, as is a log that starts past the file's generations.
func readOldLog(path string, old oldFile) ([][]store.Write, error) {
	var need []string
	switch old.format {
	case formatWAL:
		need = []string{path + ".wal"}
	case formatLogs:
		need = []string{path + oldSuffixes[old.gen%2], path + oldSuffixes[(old.gen+1)%2]}
	default:
		return nil, nil // closed cleanly
	}
	for _, p := range need {
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			return nil, &store.CorruptError{File: filepath.Base(p), Problem: "missing: the ledger file was not closed cleanly, and this write-ahead log may hold its last committed groups",
				Remedy: "restore it from the backup the ledger file came from; to open the file without those groups, create an empty file there"}
		}
	}
	var files [2][]byte
	for i, s := range oldSuffixes {
		b, err := os.ReadFile(path + s)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		files[i] = b
	}
	var groups [][]store.Write
	for g := old.gen; g <= old.gen+1; g++ {
		for i, data := range files {
			name := filepath.Base(path) + oldSuffixes[i]
			first, _, _, ok := oldRecord(data)
			switch {
			case !ok || first < g:
				continue
			case first > old.gen+1:
				return nil, &store.CorruptError{File: name, Where: "record 0 at offset 0",
					Problem: fmt.Sprintf("starts with generation %d, but the ledger file only reached %d: the file is older than its log", first, old.gen),
					Remedy:  "restore the data dir's files together from one backup"}
			case first == g:
				run, err := oldRun(name, data, g)
				if err != nil {
					return nil, err
				}
				groups = append(groups, run...)
			}
		}
	}
	return groups, nil
}

var oldSuffixes = [2]string{".wal", ".wal.1"}

// oldRun returns the groups of the run of generation gen's records at
// the start of data, the file name.
func oldRun(name string, data []byte, gen uint64) ([][]store.Write, error) {
	var groups [][]store.Write
	off := 0
	for index := uint32(0); ; index++ {
		g, i, ws, ok := oldRecord(data[off:])
		if !ok || g != gen || i != index {
			if err := laterOld(name, data, off, gen, index); err != nil {
				return nil, err
			}
			return groups, nil
		}
		if ws == nil {
			return nil, &store.CorruptError{File: name, Where: fmt.Sprintf("record %d at offset %d", index, off),
				Problem: "entries that do not decode under a valid checksum", Remedy: "restore the data dir from a backup"}
		}
		groups = append(groups, ws)
		off += oldHeader + int(binary.BigEndian.Uint32(data[off:]))
	}
}

// laterOld refuses a record of generation gen, with an index of at
// least index, after off of data, where gen's run stops: acknowledged
// groups follow the damage there.
func laterOld(name string, data []byte, off int, gen uint64, index uint32) error {
	g := binary.BigEndian.AppendUint64(nil, gen)
	for from := off + 1 + oldHeader; from < len(data); {
		i := bytes.Index(data[from:], g)
		if i < 0 {
			return nil
		}
		at := from + i - oldHeader
		if rg, ri, _, ok := oldRecord(data[at:]); ok && rg == gen && ri >= index {
			return &store.CorruptError{File: name, Where: fmt.Sprintf("record %d at offset %d", index, off),
				Problem: fmt.Sprintf("checksum mismatch or damaged header, and record %d of the same generation follows at offset %d: acknowledged writes come after the damage", ri, at),
				Remedy:  "restore the data dir from a backup"}
		}
		from += i + 1
	}
	return nil
}

// oldRecord decodes the record at the start of data: ok is false unless
// it is whole and its checksum holds, and ws is nil if its entries do
// not decode.
func oldRecord(data []byte) (gen uint64, index uint32, ws []store.Write, ok bool) {
	if len(data) < oldHeader {
		return 0, 0, nil, false
	}
	n := binary.BigEndian.Uint32(data)
	if n < oldBodyHead || n > oldMaxRecord || uint64(len(data)-oldHeader) < uint64(n) {
		return 0, 0, nil, false
	}
	body := data[oldHeader : oldHeader+int(n)]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(data[4:]) {
		return 0, 0, nil, false
	}
	ws = []store.Write{}
	for b := body[oldBodyHead:]; len(b) > 0; {
		w := store.Write{Bucket: int(b[0] &^ oldDelete), Delete: b[0]&oldDelete != 0}
		var kok, vok bool
		w.Key, b, kok = cutUvarint(b[1:])
		if !w.Delete {
			w.Value, b, vok = cutUvarint(b)
		}
		if w.Bucket >= oldBuckets || !kok || len(w.Key) == 0 || !w.Delete && !vok {
			ws = nil
			break
		}
		ws = append(ws, w)
	}
	return binary.BigEndian.Uint64(body), binary.BigEndian.Uint32(body[8:]), ws, true
}

// cutUvarint splits a uvarint-length-prefixed byte string off b.
func cutUvarint(b []byte) (v, rest []byte, ok bool) {
	n, w := binary.Uvarint(b)
	if w <= 0 || n > uint64(len(b)-w) {
		return nil, b, false
	}
	return b[w : w+int(n)], b[w+int(n):], true
}
