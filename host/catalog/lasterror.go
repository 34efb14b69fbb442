package catalog

import (
	"fmt"
	"math"
	"os/exec"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/wire"
)

// Bounds on what a process's last words keep: a few lines, each cut short,
// so that an error that quotes them stays readable and small.
const (
	maxLastLines = 3
	maxLastLine  = 240
)

// lastWords keeps what a plugin process last wrote to stderr at error
// level, and its panic message, so that an error about its exit can say
// why it exited. It keeps records as they came and formats them only in
// String, so that keeping one costs little even in a flood of them. It is
// safe for concurrent use.
type lastWords struct {
	mu      sync.Mutex
	records [maxLastLines]lastRecord // a ring of the last error-level records
	next    int                      // where the next record goes
	n       int                      // records kept, up to maxLastLines
	panic   string                   // the first line of a panic or fatal error
}

// lastRecord is one error-level record: its message and key/value pairs.
type lastRecord struct {
	msg  string
	args []any
}

// record takes one error-level record of the plugin's stderr: a message
// with key/value pairs, or a line it printed.
func (w *lastWords) record(msg string, args []any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.panic != "" {
		return // the rest of the panic: its goroutines and stack
	}
	if strings.HasPrefix(msg, "panic: ") || strings.HasPrefix(msg, "fatal error: ") {
		w.panic = format(lastRecord{msg, args})
		return
	}
	w.records[w.next] = lastRecord{msg, args}
	w.next = (w.next + 1) % maxLastLines
	w.n = min(w.n+1, maxLastLines)
}

// format returns r as one line, cut short, without the keys that say
// nothing about why the process exited.
func format(r lastRecord) string {
	var b strings.Builder
	b.WriteString(r.msg)
	for i := 0; i+1 < len(r.args); i += 2 {
		k, _ := r.args[i].(string)
		if k == "stack" || k == "@caller" {
			continue
		}
		fmt.Fprintf(&b, " %s=%v", k, r.args[i+1])
	}
	return cut(b.String())
}

// String returns the panic message, or else the last error-level lines
// joined with " | ", or "" when there were none.
func (w *lastWords) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.panic != "" {
		return w.panic
	}
	lines := make([]string, 0, w.n)
	for i := range w.n {
		lines = append(lines, format(w.records[(w.next-w.n+i+maxLastLines)%maxLastLines]))
	}
	return strings.Join(lines, " | ")
}

func cut(s string) string {
	if len(s) <= maxLastLine {
		return s
	}
	return s[:maxLastLine] + "…"
}

// ExitError is the error of a call that failed because the plugin process
// exited. It says how the process ended and its last words; Unwrap
// returns the call's own error.
type ExitError struct {
	// During names the step the process died in, such as "start".
	During string
	// Status is how the process ended: "exit status 2", "signal: killed".
	Status string
	// Last is the panic message or the last lines the process logged at
	// error level; "" when it logged none.
	Last string
	Err  error
}

func (e *ExitError) Error() string {
	s := "plugin exited"
	if e.During != "" {
		s += " during " + e.During
	}
	if e.Status != "" {
		s += " (" + e.Status + ")"
	}
	if e.Last != "" {
		return s + ": " + e.Last
	}
	return s + " without logging an error"
}

func (e *ExitError) Unwrap() error { return e.Err }

// exitStatus returns how cmd ended, once it has been waited for.
func exitStatus(cmd *exec.Cmd) string {
	if cmd.ProcessState == nil {
		return ""
	}
	return cmd.ProcessState.String()
}

// corruptError is a plugin's report that its stored data is corrupt: the
// plugin's message, which wraps sdk.ErrStorageCorrupt.
type corruptError struct{ msg string }

func (e *corruptError) Error() string { return e.msg }
func (e *corruptError) Unwrap() error { return sdk.ErrStorageCorrupt }

// recordingLogger is the logger the plugin's stderr records go through:
// its error-level ones are kept in words, and each is logged as far as
// limit allows. A record dropped by limit is still kept in words, so that
// a flood does not hide why the plugin exited.
type recordingLogger struct {
	hclog.Logger
	words *lastWords
	limit *logLimiter
}

// Log logs at level, keeping an error-level record.
func (l recordingLogger) Log(level hclog.Level, msg string, args ...any) {
	switch level {
	case hclog.Error:
		l.Error(msg, args...)
	case hclog.Warn:
		l.Warn(msg, args...)
	case hclog.Info:
		l.Info(msg, args...)
	case hclog.Debug:
		l.Debug(msg, args...)
	default:
		l.Trace(msg, args...)
	}
}

// allow reports whether a record at level may be logged: one the logger
// would log that the limiter allows.
func (l recordingLogger) allow(level hclog.Level, msg string, args []any) bool {
	if level < l.Logger.GetLevel() {
		return false
	}
	return l.limit.allow(wire.LogRecordSize(msg, args))
}

// Trace logs at trace level as far as the limiter allows.
func (l recordingLogger) Trace(msg string, args ...any) {
	if l.allow(hclog.Trace, msg, args) {
		l.Logger.Trace(msg, args...)
	}
}

// Debug logs at debug level as far as the limiter allows.
func (l recordingLogger) Debug(msg string, args ...any) {
	if l.allow(hclog.Debug, msg, args) {
		l.Logger.Debug(msg, args...)
	}
}

// Info logs at info level as far as the limiter allows.
func (l recordingLogger) Info(msg string, args ...any) {
	if l.allow(hclog.Info, msg, args) {
		l.Logger.Info(msg, args...)
	}
}

// Warn logs at warn level as far as the limiter allows. The SDK's report
// of the records it dropped in the plugin is counted with the host's own
// drops, and the error it quotes is kept, whether or not it is logged.
func (l recordingLogger) Warn(msg string, args ...any) {
	if msg == wire.LogDroppedMsg {
		l.sourceDropped(args)
	}
	if l.allow(hclog.Warn, msg, args) {
		l.Logger.Warn(msg, args...)
	}
}

// Error keeps the record and logs it at error level as far as the limiter
// allows. A record of the plugin's own go-plugin multiplexer is logged at
// debug and not kept, as the host's own are (muxLogger): it says the
// session to the host broke, which the host knows better.
func (l recordingLogger) Error(msg string, args ...any) {
	if muxRecord(args) {
		l.Debug(msg, args...)
		return
	}
	l.words.record(msg, args)
	if l.allow(hclog.Error, msg, args) {
		l.Logger.Error(msg, args...)
	}
}

// maxReportedDrops bounds the count one report of the SDK adds: far more
// than a plugin can log in a report's interval, and far less than a
// float64 counts exactly.
const maxReportedDrops = 1 << 40

// sourceDropped takes the SDK's report of the records it dropped, the
// key/value pairs args of a record at warn with message
// wire.LogDroppedMsg: it counts the records (a count that is not a whole
// number from 1 to maxReportedDrops is ignored, as a plugin's output is
// not trusted) and keeps the error it quotes as one of the plugin's last
// words. Only a limited plugin's SDK drops records, so for an unlimited
// one it does nothing.
func (l recordingLogger) sourceDropped(args []any) {
	if l.limit == nil {
		return
	}
	for i := 0; i+1 < len(args); i += 2 {
		switch k, _ := args[i].(string); k {
		case wire.LogDroppedKey:
			// go-plugin decodes the record's JSON numbers as float64.
			if n, ok := args[i+1].(float64); ok && n >= 1 && n <= maxReportedDrops && n == math.Trunc(n) {
				l.limit.counted(int(n))
			}
		case wire.LogLastErrorKey:
			if s, ok := args[i+1].(string); ok && s != "" {
				l.words.record(s, nil)
			}
		}
	}
}

// muxRecord reports whether args, a plugin's record's key/value pairs,
// name go-plugin's multiplexer as the record's module: hclog's
// "@module" is the logger's name, and go-plugin names the multiplexer's
// logger "yamux".
func muxRecord(args []any) bool {
	for i := 0; i+1 < len(args); i += 2 {
		if k, _ := args[i].(string); k == "@module" {
			v, _ := args[i+1].(string)
			return v == "yamux" || strings.HasSuffix(v, ".yamux")
		}
	}
	return false
}

// With returns a sub-logger with args that records too.
func (l recordingLogger) With(args ...any) hclog.Logger {
	return recordingLogger{l.Logger.With(args...), l.words, l.limit}
}

// Named returns a named sub-logger that records too.
func (l recordingLogger) Named(name string) hclog.Logger {
	return recordingLogger{l.Logger.Named(name), l.words, l.limit}
}

// ResetNamed returns a sub-logger with name as its name that records too.
func (l recordingLogger) ResetNamed(name string) hclog.Logger {
	return recordingLogger{l.Logger.ResetNamed(name), l.words, l.limit}
}

// maxStderrTail bounds what stderrTail keeps of a plugin's output before
// the handshake.
const maxStderrTail = 2 << 10

// stderrTail keeps the end of what a plugin process wrote to stderr until
// its handshake is done, which go-plugin hands to ClientConfig.Stderr
// line by line: a plugin that fails before sdk.Serve, or a binary that is
// not a plugin, says why only there, in lines go-plugin logs at debug.
// Once the handshake is done (stop), the plugin's records are logged, and
// kept in lastWords, instead. It is safe for concurrent use.
type stderrTail struct {
	mu      sync.Mutex
	b       []byte
	stopped bool
}

// Write keeps the end of p, up to maxStderrTail bytes with what came
// before.
func (t *stderrTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return len(p), nil
	}
	t.b = append(t.b, p...)
	if len(t.b) > 2*maxStderrTail {
		t.b = append(t.b[:0], t.b[len(t.b)-maxStderrTail:]...)
	}
	return len(p), nil
}

// stop ends the keeping, and frees what was kept.
func (t *stderrTail) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped, t.b = true, nil
}

// String returns the last maxStderrTail bytes kept, from a line's start
// where one begins within them, without surrounding space.
func (t *stderrTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.b
	if len(b) > maxStderrTail {
		b = b[len(b)-maxStderrTail:]
		if i := strings.IndexByte(string(b), '\n'); i >= 0 && i < len(b)-1 {
			b = b[i+1:]
		}
		return "…" + strings.TrimSpace(string(b))
	}
	return strings.TrimSpace(string(b))
}
