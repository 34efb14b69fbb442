package store

import (
	"os"
	"syscall"
)

// Fdatasync writes f's data, and only the metadata needed to read it
// back, to disk: what the log does after each append, for Hooks that
// wrap it.
func Fdatasync(f *os.File) error { return fdatasync(f) }

// fdatasync writes f's data, and only the metadata needed to read it
// back, to disk.
func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}
