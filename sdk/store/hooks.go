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
// its next record on; nil restores fdatasync. fn may block (a stalled
// disk) or fail.
func (h *Hooks) SetSync(fn func(*os.File) error) {
	if fn == nil {
		h.sync.Store(nil)
		return
	}
	h.sync.Store(&fn)
}

// syncer returns the log's fdatasync under h.
func (h *Hooks) syncer() func(*os.File) error {
	if h == nil {
		return fdatasync
	}
	return func(f *os.File) error {
		if fn := h.sync.Load(); fn != nil {
			return (*fn)(f)
		}
		return fdatasync(f)
	}
}

func init() {
	testhook.LogEnd = func(db any) (string, int64) { return logEnd(db.(*DB)) }
	testhook.Rotate = func(db any) error { return rotateOnly(db.(*DB)) }
	testhook.ForeignRecord = foreignRecord
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
