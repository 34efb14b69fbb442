package catalog

import (
	"io"
	"log"

	"github.com/hashicorp/go-hclog"
)

// goPluginKeys renames the keys go-plugin puts in its records that clash
// with the keys of the logger it is given: it logs "plugin process exited"
// with plugin=PATH on a logger the supervisor tagged plugin=NAME.
var goPluginKeys = map[string]string{"plugin": "path"}

// goPluginLogger is the logger go-plugin's client gets: the launch's
// logger, with go-plugin's clashing keys renamed (goPluginKeys), so that no
// record carries a key twice. go-plugin logs the plugin's stderr through a
// sub-logger named after the binary; that one keeps the plugin's
// error-level records in words, for an error about the plugin's exit, and
// passes its records through limit.
type goPluginLogger struct {
	hclog.Logger
	words *lastWords
	limit *logLimiter
	// check is Options.Check.
	check bool
	// relay marks the logger of the plugin's own records, to which
	// go-plugin adds the plugin's time as a last "timestamp" pair: the
	// host's record has its own time (@timestamp in JSON), and two would
	// only disagree by the relay's delay, so it is dropped.
	relay bool
}

// keys returns args ready to log: without go-plugin's "timestamp" on a
// relayed record, and with clashing keys renamed.
func (l goPluginLogger) keys(args []any) []any {
	if n := len(args); l.relay && n >= 2 && args[n-2] == "timestamp" {
		args = args[:n-2]
	}
	return renameKeys(args)
}

// processExited is the record go-plugin's client logs when the plugin
// process ends, at info when it exited cleanly.
const processExited = "plugin process exited"

// Log logs at level with the keys of args renamed.
func (l goPluginLogger) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Info && l.check && msg == processExited {
		l.Debug(msg, args...)
		return
	}
	l.Logger.Log(level, msg, l.keys(args)...)
}

// Trace logs at trace level with the keys of args renamed.
func (l goPluginLogger) Trace(msg string, args ...any) { l.Logger.Trace(msg, l.keys(args)...) }

// Debug logs at debug level with the keys of args renamed.
func (l goPluginLogger) Debug(msg string, args ...any) {
	if l.check && msg == processExited {
		msg = "checked plugin process exited"
	}
	l.Logger.Debug(msg, l.keys(args)...)
}

// Info logs at info level with the keys of args renamed; the clean exit
// of a checked plugin's process at debug (Options.Check).
func (l goPluginLogger) Info(msg string, args ...any) {
	if l.check && msg == processExited {
		l.Debug(msg, args...)
		return
	}
	l.Logger.Info(msg, l.keys(args)...)
}

// Warn logs at warn level with the keys of args renamed.
func (l goPluginLogger) Warn(msg string, args ...any) { l.Logger.Warn(msg, l.keys(args)...) }

// Error logs at error level with the keys of args renamed.
func (l goPluginLogger) Error(msg string, args ...any) { l.Logger.Error(msg, l.keys(args)...) }

// With returns a sub-logger with args, keys renamed, that renames too.
func (l goPluginLogger) With(args ...any) hclog.Logger {
	return goPluginLogger{l.Logger.With(renameKeys(args)...), l.words, l.limit, l.check, l.relay}
}

// Named returns a named sub-logger that renames too. Unless it is one of
// go-plugin's own (its stdio stream's, or its connection multiplexer's:
// muxLogger), it is the one for the plugin's stderr, and keeps its
// error-level records and limits its records.
func (l goPluginLogger) Named(name string) hclog.Logger {
	switch {
	case l.words != nil && name == "yamux":
		return muxLogger{l.Logger.Named(name)}
	case l.words == nil || name == "stdio":
		return goPluginLogger{Logger: l.Logger.Named(name)}
	}
	return goPluginLogger{Logger: recordingLogger{l.Logger.Named(name), l.words, l.limit}, relay: true}
}

// muxLogger is the logger of go-plugin's connection multiplexer (yamux),
// which logs through a standard logger. Its records are about the session
// to the plugin process: a write that failed because the process exited
// or is being stopped, a keepalive that timed out. Each one that matters
// reaches the supervisor as a failed call or an exit, which it logs with
// what it means, so yamux's own records are logged at debug: a plugin the
// host stops in the middle of a write is no error.
type muxLogger struct{ hclog.Logger }

// StandardLogger returns a standard logger that logs at debug.
func (l muxLogger) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(l.StandardWriter(opts), "", 0)
}

// StandardWriter returns a writer that logs each line at debug.
func (l muxLogger) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	o := hclog.StandardLoggerOptions{}
	if opts != nil {
		o = *opts
	}
	o.ForceLevel = hclog.Debug
	return l.Logger.StandardWriter(&o)
}

// ResetNamed returns a sub-logger with name as its name that renames too.
func (l goPluginLogger) ResetNamed(name string) hclog.Logger {
	return goPluginLogger{Logger: l.Logger.ResetNamed(name)}
}

// renameKeys returns args, key/value pairs, with the keys in goPluginKeys
// renamed; it copies args only when it renames one.
func renameKeys(args []any) []any {
	out, copied := args, false
	for i := 0; i+1 < len(args); i += 2 {
		k, ok := args[i].(string)
		if !ok {
			continue
		}
		if to, clash := goPluginKeys[k]; clash {
			if !copied {
				out, copied = append([]any(nil), args...), true
			}
			out[i] = to
		}
	}
	return out
}
