package ledger

import "os"

// LogEnd returns the suffix of the write-ahead log file the next record
// goes to (after the ledger's path), and where in it: the end of its
// last record.
func LogEnd(l *Ledger) (string, int64) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return walSuffixes[l.log.gen%2], l.log.off
}

// Rotate starts the write-ahead log's next generation, as a checkpoint
// does first, and leaves the last one's groups out of the bbolt file, as
// a checkpoint that has not committed yet does.
func Rotate(l *Ledger) {
	l.cmu.Lock()
	defer l.cmu.Unlock()
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.rotate()
}

// SetLogSync makes the write-ahead log call sync instead of fdatasync.
func SetLogSync(l *Ledger, sync func(*os.File) error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.log.sync = sync
}

// WithOpenFile returns opts with the bbolt file opened by open.
func WithOpenFile(opts Options, open func(string, int, os.FileMode) (*os.File, error)) Options {
	opts.openFile = open
	return opts
}

// ForeignRecord returns a whole log record of generation gen, as another
// ledger's log would hold.
func ForeignRecord(gen uint64) []byte {
	return appendRecord(nil, gen, 0, []entry{{b: bMeta, k: []byte("foreign"), v: []byte("x")}})
}

// WithMmapSize returns opts with bbolt's initial memory map of size
// bytes, so that a checkpoint that grows the file past it remaps.
func WithMmapSize(opts Options, size int) Options {
	opts.mmapSize = size
	return opts
}
