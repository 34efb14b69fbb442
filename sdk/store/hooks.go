package store

import (
	"os"
	"sync/atomic"

	"github.com/plughost/plughost/sdk/store/internal/testhook"
)

// Hooks are fault-injection points, for tests and fault drills of
// plugins built on the store. Leave Options.Hooks nil otherwise.
type Hooks struct {
	// OpenFile, if set, opens the bbolt file (bbolt's Options.OpenFile):
	// to make its writes fail.
	OpenFile func(name string, flag int, perm os.FileMode) (*os.File, error)
	// MmapSize, if set, replaces the bbolt file's initial memory map: to
	// make a checkpoint remap.
	MmapSize int

	sync atomic.Pointer[func(*os.File) error]
}

// SetSync makes the write-ahead log call fn instead of fdatasync, from
// its next record on, and Import call it instead of its syncs of the
// new file and of its directory; nil restores fdatasync. fn may block (a
// stalled disk) or fail.
func (h *Hooks) SetSync(fn func(*os.File) error) {
	if fn == nil {
		h.sync.Store(nil)
		return
	}
	h.sync.Store(&fn)
}

// syncer returns the log's fdatasync under h.
func (h *Hooks) syncer() func(*os.File) error { return h.syncerOr(fdatasync) }

// syncerOr returns sync under h: the function SetSync set, if any.
func (h *Hooks) syncerOr(sync func(*os.File) error) func(*os.File) error {
	if h == nil {
		return sync
	}
	return func(f *os.File) error {
		if fn := h.sync.Load(); fn != nil {
			return (*fn)(f)
		}
		return sync(f)
	}
}

func init() {
	testhook.LogEnd = func(db any) (string, int64) { return logEnd(db.(*DB)) }
	testhook.Rotate = func(db any) error { return rotateOnly(db.(*DB)) }
	testhook.ForeignRecord = foreignRecord
	testhook.CopyFiles = func(db any, to string, locked func()) error { return copyFiles(db.(*DB), to, locked) }
}

// copyFiles copies d's files to to (and to.wal, to.wal.1) as kill -9
// would leave them (storetest.Copy): it holds the writers' lock, so that
// every group acknowledged is in the copy and no group is half in it,
// while a checkpoint may be writing the bbolt file, which bbolt keeps
// consistent for a copy (the pages a meta names are written before it).
// locked, if set, runs under the lock.
func copyFiles(d *DB, to string, locked func()) error {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if locked != nil {
		locked()
	}
	for _, suffix := range []string{"", ".wal", ".wal.1"} {
		data, err := os.ReadFile(d.path + suffix)
		if err != nil {
			return err
		}
		if err := os.WriteFile(to+suffix, data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// logEnd returns the name of the log file the next record goes to and
// where in it: the end of its last record (storetest.LogEnd).
func logEnd(d *DB) (string, int64) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	return d.name + walSuffixes[d.log.gen%2], d.log.off
}

// rotateOnly starts the write-ahead log's next generation, as a
// checkpoint does first, and leaves the last one's groups out of the
// bbolt file, as a checkpoint that has not committed yet does
// (storetest.Rotate).
func rotateOnly(d *DB) error {
	d.cmu.Lock()
	defer d.cmu.Unlock()
	d.wmu.Lock()
	defer d.wmu.Unlock()
	return d.rotate()
}

// foreignRecord returns a whole log record of generation gen that puts
// key "foreign" in bucket 0, as another store's log would hold
// (storetest.ForeignRecord).
func foreignRecord(gen uint64) []byte {
	return appendRecord(nil, gen, 0, []entry{{b: 0, k: []byte("foreign"), v: []byte("x")}})
}
