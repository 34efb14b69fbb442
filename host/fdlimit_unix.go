//go:build unix

package main

import "syscall"

// fdLimit returns the process's soft and hard RLIMIT_NOFILE.
func fdLimit() (soft, hard uint64, err error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, 0, err
	}
	return uint64(l.Cur), uint64(l.Max), nil
}
