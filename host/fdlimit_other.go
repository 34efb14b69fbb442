//go:build !unix

package main

import "errors"

// fdLimit reports that there is no RLIMIT_NOFILE to read.
func fdLimit() (soft, hard uint64, err error) {
	return 0, 0, errors.New("no RLIMIT_NOFILE on this platform")
}
