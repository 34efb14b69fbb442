package ingress

import (
	"testing"
	"time"
)

// Exported for tests of functions no test can reach through the
// ingress's own interfaces: a host has no second address in a loopback
// IPv6 /64, and a stream's lifetime is random.
var (
	ClientKey = clientKey
	Jittered  = jittered
	BodyLimit = bodyLimit
	BodyBound = bodyBound
)

// SetLinger sets the lingering close's bounds of time (no gap over
// timeout, at most total in all) until the test ends; its bound of bytes
// stays.
func SetLinger(t testing.TB, timeout, total time.Duration) {
	oldTimeout, oldTotal := lingerTimeout, lingerTime
	lingerTimeout, lingerTime = timeout, total
	t.Cleanup(func() { lingerTimeout, lingerTime = oldTimeout, oldTotal })
}
