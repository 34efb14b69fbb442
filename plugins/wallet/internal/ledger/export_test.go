package ledger

import "os"

// SetLogFile makes the write-ahead log write to f and returns the file it
// wrote to, so that tests can make its writes fail.
func SetLogFile(l *Ledger, f *os.File) *os.File {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	old := l.log.f
	l.log.f = f
	return old
}

// LogEnd returns where the write-ahead log's next record goes: the end of
// its last record.
func LogEnd(l *Ledger) int64 {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.log.off
}
