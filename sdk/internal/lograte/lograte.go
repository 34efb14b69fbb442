// Package lograte limits a plugin's logger in the plugin process: it drops
// the records over the log rate the host passed (wire.LogRateEnv), by the
// host's own rule (wire.LogBucket), before they are formatted and cross to
// the host, and reports once a second how many it dropped. A record the
// host would drop anyway then costs the host nothing.
//
// It limits only the SDK's logger; it must not touch what a plugin writes
// to os.Stdout or os.Stderr itself. Nor is it a defence: the host limits
// every plugin's output again, whatever the plugin does.
package lograte

import (
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/sdk/wire"
)

// ReportInterval is how often, while it drops records, a Limiter reports
// how many it dropped.
const ReportInterval = time.Second

// maxLastError bounds the last dropped error a report quotes.
const maxLastError = 512

// Options configure New.
type Options struct {
	// Rate is the records a second the bucket refills with; 0 or less
	// turns the limit off.
	Rate int
	// Burst is the bucket's size; at least 1 is used.
	Burst int
	// Report is the logger the reports go to: one that writes to the
	// same output as the limited logger, and is not limited itself.
	Report hclog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
	// AfterFunc runs f once d has passed, as time.AfterFunc does, which
	// is the default.
	AfterFunc func(d time.Duration, f func())
}

// Limiter is a wire.LogBucket over the records of one logger, built with
// its Exclude as the logger's hclog Exclude. Call Close when the logger is
// done with. A nil *Limiter limits nothing. It is safe for concurrent use.
type Limiter struct {
	report    hclog.Logger
	now       func() time.Time
	afterFunc func(time.Duration, func())

	mu         sync.Mutex
	bucket     wire.LogBucket
	lost       int    // records dropped since the last report
	lostErrors int    // error-level records among them
	lastError  string // the last of those, formatted
	due        bool   // a report is scheduled
}

// New returns a Limiter of opts, or nil when opts has no rate.
func New(opts Options) *Limiter {
	if opts.Rate <= 0 {
		return nil
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.AfterFunc == nil {
		opts.AfterFunc = func(d time.Duration, f func()) { time.AfterFunc(d, f) }
	}
	if opts.Report == nil {
		opts.Report = hclog.NewNullLogger()
	}
	return &Limiter{
		report: opts.Report, now: opts.Now, afterFunc: opts.AfterFunc,
		bucket: wire.NewLogBucket(opts.Rate, opts.Burst, opts.Now()),
	}
}

// Exclude reports whether the record at level with message msg and
// key/value pairs args is to be dropped: whether the bucket is short of
// its tokens, sized as the host sizes them (wire.LogRecordSize). hclog
// calls it before it formats a record.
//
// Error-level records are dropped like the others, since a plugin that
// floods errors costs the host as much as any other flood; but they are
// counted apart, and the last one dropped is quoted in the report, which
// the host keeps among the plugin's last words.
func (l *Limiter) Exclude(level hclog.Level, msg string, args ...any) bool {
	if l == nil {
		return false
	}
	now := l.now()
	l.mu.Lock()
	ok := l.bucket.Take(wire.LogRecordSize(msg, args), now)
	l.mu.Unlock()
	if ok {
		return false
	}
	isError := level >= hclog.Error
	var last string
	if isError {
		// Formatted now, while its values are the caller's to read.
		last = formatRecord(msg, args)
	}
	l.mu.Lock()
	l.lost++
	if isError {
		l.lostErrors++
		l.lastError = last
	}
	schedule := !l.due
	l.due = true
	l.mu.Unlock()
	if schedule {
		l.afterFunc(ReportInterval, l.flush)
	}
	return true
}

// flush reports the records dropped since the last report, if any.
func (l *Limiter) flush() {
	l.mu.Lock()
	n, errs, last := l.lost, l.lostErrors, l.lastError
	l.lost, l.lostErrors, l.lastError, l.due = 0, 0, "", false
	l.mu.Unlock()
	if n == 0 {
		return
	}
	args := []any{wire.LogDroppedKey, n, wire.LogDroppedErrorsKey, errs, "interval", ReportInterval.String()}
	if last != "" {
		args = append(args, wire.LogLastErrorKey, last)
	}
	// The report is never dropped, but it is paid for, so that what
	// crosses to the host stays within the host's own limit.
	now := l.now()
	l.mu.Lock()
	l.bucket.Charge(wire.LogRecordSize(wire.LogDroppedMsg, args), now)
	l.mu.Unlock()
	l.report.Warn(wire.LogDroppedMsg, args...)
}

// Close reports the records dropped since the last report. A report
// already scheduled then finds none to report.
func (l *Limiter) Close() {
	if l == nil {
		return
	}
	l.flush()
}

// formatRecord returns a record as one line, "msg key=value ...", cut to
// maxLastError bytes.
func formatRecord(msg string, args []any) string {
	var b strings.Builder
	b.WriteString(msg)
	for i := 0; i+1 < len(args) && b.Len() < maxLastError; i += 2 {
		fmt.Fprintf(&b, " %v=%v", args[i], args[i+1])
	}
	s := b.String()
	if len(s) <= maxLastError {
		return s
	}
	n := maxLastError
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
