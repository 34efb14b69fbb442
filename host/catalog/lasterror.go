package catalog

import (
	"fmt"
	"os/exec"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/sdk"
)

// Bounds on what a process's last words keep: a few lines, each cut short,
// so that an error that quotes them stays readable and small.
const (
	maxLastLines = 3
	maxLastLine  = 240
)

// lastWords keeps what a plugin process last wrote to stderr at error
// level, and its panic message, so that an error about its exit can say
// why it exited. It is safe for concurrent use.
type lastWords struct {
	mu    sync.Mutex
	lines []string // the last error-level lines, oldest first
	panic string   // the first line of a panic or fatal error
}

// record takes one error-level record of the plugin's stderr: a message
// with key/value pairs, or a line it printed.
func (w *lastWords) record(msg string, args []any) {
	var b strings.Builder
	b.WriteString(msg)
	for i := 0; i+1 < len(args); i += 2 {
		k, _ := args[i].(string)
		if k == "timestamp" || k == "stack" || k == "@caller" {
			continue
		}
		fmt.Fprintf(&b, " %s=%v", k, args[i+1])
	}
	line := cut(b.String())
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.panic != "" {
		return // the rest of the panic: its goroutines and stack
	}
	if strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ") {
		w.panic = line
		return
	}
	w.lines = append(w.lines, line)
	if len(w.lines) > maxLastLines {
		w.lines = w.lines[len(w.lines)-maxLastLines:]
	}
}

// String returns the panic message, or else the last error-level lines
// joined with " | ", or "" when there were none.
func (w *lastWords) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.panic != "" {
		return w.panic
	}
	return strings.Join(w.lines, " | ")
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
// its error-level ones are kept in words as well as logged.
type recordingLogger struct {
	hclog.Logger
	words *lastWords
}

// Log logs at level, keeping an error-level record.
func (l recordingLogger) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Error {
		l.Error(msg, args...)
		return
	}
	l.Logger.Log(level, msg, args...)
}

// Error logs at error level and keeps the record. A record of the
// plugin's own go-plugin multiplexer is logged at debug and not kept, as
// the host's own are (muxLogger): it says the session to the host broke,
// which the host knows better.
func (l recordingLogger) Error(msg string, args ...any) {
	if muxRecord(args) {
		l.Logger.Debug(msg, args...)
		return
	}
	l.words.record(msg, args)
	l.Logger.Error(msg, args...)
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
	return recordingLogger{l.Logger.With(args...), l.words}
}

// Named returns a named sub-logger that records too.
func (l recordingLogger) Named(name string) hclog.Logger {
	return recordingLogger{l.Logger.Named(name), l.words}
}

// ResetNamed returns a sub-logger with name as its name that records too.
func (l recordingLogger) ResetNamed(name string) hclog.Logger {
	return recordingLogger{l.Logger.ResetNamed(name), l.words}
}
