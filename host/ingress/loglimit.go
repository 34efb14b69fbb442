package ingress

import (
	"sync/atomic"
	"time"
)

// warnEvery is how often the ingress logs a warning of one kind for one
// plugin at most: a plugin that fails every request in flight at once
// (killed, say, with hundreds in flight) makes one line, not hundreds.
const warnEvery = time.Second

// logLimiter lets one log line through per warnEvery and counts the
// others, which the next line reports. Its zero value is ready to use.
type logLimiter struct {
	next       atomic.Int64 // unix nanoseconds before which lines are suppressed
	suppressed atomic.Int64
}

// allow reports whether a line may be logged at now, and if so how many
// were suppressed since the last one.
func (l *logLimiter) allow(now time.Time) (bool, int64) {
	next := l.next.Load()
	if now.UnixNano() < next || !l.next.CompareAndSwap(next, now.Add(warnEvery).UnixNano()) {
		l.suppressed.Add(1)
		return false, 0
	}
	return true, l.suppressed.Swap(0)
}
