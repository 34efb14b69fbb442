//go:build unix

package store

import (
	"errors"
	"os"
	"syscall"
	"time"

	berrors "go.etcd.io/bbolt/errors"
)

// lockFile takes the exclusive flock bbolt takes on its file, waiting up
// to timeout, and fails with bbolt's ErrTimeout as bbolt would. bbolt's
// own flock of the same open file then holds at once.
func lockFile(f *os.File, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EINTR):
			continue
		case !errors.Is(err, syscall.EWOULDBLOCK):
			return err
		case time.Now().After(deadline):
			return berrors.ErrTimeout
		}
		time.Sleep(50 * time.Millisecond) // bbolt's flockRetryTimeout
	}
}
