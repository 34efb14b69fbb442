package dataplane

import (
	"sync/atomic"
	"testing"
)

// CountYields counts the flushers' yields until t's cleanup, which must
// run after that of every Transport made meanwhile: call it first.
func CountYields(t *testing.T) *atomic.Int64 {
	var n atomic.Int64
	old := yield
	yield = func() {
		n.Add(1)
		old()
	}
	t.Cleanup(func() { yield = old })
	return &n
}
