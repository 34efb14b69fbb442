package ledger

import "os"

// LogEnd returns where the write-ahead log's next record goes: the end of
// its last record.
func LogEnd(l *Ledger) int64 {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.log.off
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
