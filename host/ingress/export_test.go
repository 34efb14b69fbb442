package ingress

import "time"

// Exported for tests of functions no test can reach through the
// ingress's own interfaces: a host has no second address in a loopback
// IPv6 /64, and a stream's lifetime is random.
var (
	ClientKey = clientKey
	Jittered  = jittered
)

// SetLinger shortens the lingering close's bounds (no gap over timeout,
// at most total) until the test ends.
func SetLinger(t interface{ Cleanup(func()) }, timeout, total time.Duration) {
	oldTimeout, oldTotal := lingerTimeout, lingerTime
	lingerTimeout, lingerTime = timeout, total
	t.Cleanup(func() { lingerTimeout, lingerTime = oldTimeout, oldTotal })
}
