package catalog

import (
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// LogLimit is a token bucket over a plugin process's relayed log records:
// its stdout and stderr lines and the records of its stderr logger alike.
// The bucket holds Burst tokens and gains Rate a second; a record takes
// one token per started logUnit bytes of its text, and a record that finds
// too few is dropped, never waited for, so that the reader of the
// plugin's pipe never stalls the plugin.
type LogLimit struct {
	// Rate is the records a second the bucket refills with; 0 turns the
	// limit off.
	Rate int
	// Burst is the bucket's size: the records logged at once after a
	// quiet spell.
	Burst int
	// Dropped, when not nil, is called with the count of records dropped
	// since it was last called, at most once per LogReportInterval and
	// once when the process's logging ends. It must not block.
	Dropped func(n int)
}

// LogReportInterval is how often the host logs, for a plugin whose
// records it dropped, how many it dropped.
const LogReportInterval = time.Second

// logUnit is the record size one token pays for: a longer record takes
// one token per started logUnit, so that the bucket bounds bytes as well
// as records.
const logUnit = 4 << 10

// logLimiter is a LogLimit at work for one plugin process. A nil
// *logLimiter allows every record. It is safe for concurrent use.
type logLimiter struct {
	rate, burst float64
	logger      hclog.Logger
	dropped     func(n int)
	now         func() time.Time

	mu      sync.Mutex
	tokens  float64
	last    time.Time
	lost    int         // records dropped since the last report
	timer   *time.Timer // the next report, while one is due
	pending sync.WaitGroup
	closed  bool
}

// newLogLimiter returns the limiter of lim that reports its drops on
// logger, or nil when lim has no rate. Call close when the process's
// logging has ended.
func newLogLimiter(lim LogLimit, logger hclog.Logger, now func() time.Time) *logLimiter {
	if lim.Rate <= 0 {
		return nil
	}
	burst := max(lim.Burst, 1)
	return &logLimiter{
		rate: float64(lim.Rate), burst: float64(burst),
		logger: logger, dropped: lim.Dropped, now: now,
		tokens: float64(burst), last: now(),
	}
}

// allow reports whether a record of size bytes may be logged, taking its
// tokens when it may and counting it as dropped when not.
func (l *logLimiter) allow(size int) bool {
	if l == nil {
		return true
	}
	cost := float64(max(1, (size+logUnit-1)/logUnit))
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if d := now.Sub(l.last); d > 0 {
		l.tokens = min(l.burst, l.tokens+d.Seconds()*l.rate)
		l.last = now
	}
	if l.tokens >= cost {
		l.tokens -= cost
		return true
	}
	l.lostLocked(1)
	return false
}

// drop counts n records dropped without asking for tokens: the rest of
// a chunk of output whose first record found the bucket short.
func (l *logLimiter) drop(n int) {
	if l == nil || n == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lostLocked(n)
}

// lostLocked counts n dropped records and makes sure a report is due.
// l.mu must be held.
func (l *logLimiter) lostLocked(n int) {
	l.lost += n
	if l.timer == nil && !l.closed {
		l.pending.Add(1)
		l.timer = time.AfterFunc(LogReportInterval, l.report)
	}
}

// report logs and hands on the count of records dropped since the last
// report.
func (l *logLimiter) report() {
	defer l.pending.Done()
	l.mu.Lock()
	n := l.lost
	l.lost, l.timer = 0, nil
	l.mu.Unlock()
	l.tell(n)
}

func (l *logLimiter) tell(n int) {
	if n == 0 {
		return
	}
	l.logger.Warn("dropped plugin output over its log rate", "lines", n, "interval", LogReportInterval.String())
	if l.dropped != nil {
		l.dropped(n)
	}
}

// close reports the records dropped since the last report, once a report
// already due has run.
func (l *logLimiter) close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.closed = true
	if l.timer != nil && l.timer.Stop() {
		l.timer = nil
		l.pending.Done()
	}
	l.mu.Unlock()
	l.pending.Wait()
	l.mu.Lock()
	n := l.lost
	l.lost = 0
	l.mu.Unlock()
	l.tell(n)
}
