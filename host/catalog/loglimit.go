package catalog

import (
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/sdk/wire"
)

// LogLimit is a token bucket (wire.LogBucket) over a plugin process's
// relayed log records: its stdout and stderr lines and the records of its
// stderr logger alike. The bucket holds Burst tokens and gains Rate a
// second; a record takes one token per started wire.LogUnit bytes of its
// text, and a record that finds too few is dropped, never waited for, so
// that the reader of the plugin's pipe never stalls the plugin. Launch
// passes Rate and Burst to the process too (wire.LogRateEnv), so that a
// plugin built with the SDK drops its logger's excess before it crosses;
// this limit still holds every plugin, built with the SDK or not.
type LogLimit struct {
	// Rate is the records a second the bucket refills with; 0 turns the
	// limit off.
	Rate int
	// Burst is the bucket's size: the records logged at once after a
	// quiet spell.
	Burst int
	// Dropped, when not nil, is called with the count of records dropped
	// since it was last called, at most once per LogReportInterval and
	// once when the process's logging ends, and with the counts the SDK
	// in the plugin reports it dropped (wire.LogDroppedMsg). It must not
	// block.
	Dropped func(n int)
}

// LogReportInterval is how often the host logs, for a plugin whose
// records it dropped, how many it dropped.
const LogReportInterval = time.Second

// logLimiter is a LogLimit at work for one plugin process. A nil
// *logLimiter allows every record. It is safe for concurrent use.
type logLimiter struct {
	logger  hclog.Logger
	dropped func(n int)
	now     func() time.Time

	mu      sync.Mutex
	bucket  wire.LogBucket
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
	return &logLimiter{
		logger: logger, dropped: lim.Dropped, now: now,
		bucket: wire.NewLogBucket(lim.Rate, lim.Burst, now()),
	}
}

// allow reports whether a record of size bytes may be logged, taking its
// tokens when it may and counting it as dropped when not.
func (l *logLimiter) allow(size int) bool {
	if l == nil {
		return true
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bucket.Take(size, now) {
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

// counted hands on n records that the plugin dropped itself before they
// reached the host; the plugin's own report of them is its record to log.
func (l *logLimiter) counted(n int) {
	if l.dropped != nil {
		l.dropped(n)
	}
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
