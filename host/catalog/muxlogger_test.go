package catalog

import (
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/host/internal/testbin"
)

// TestMuxLoggerAtDebug checks that go-plugin's multiplexer logs through
// the launch's logger at debug, whatever level yamux gives its line, and
// that its lines are not taken for the plugin's last words.
func TestMuxLoggerAtDebug(t *testing.T) {
	buf := &testbin.SyncBuffer{}
	words := &lastWords{}
	l := goPluginLogger{Logger: hclog.New(&hclog.LoggerOptions{Name: "plughost", Level: hclog.Trace, Output: buf}), words: words}

	// As go-plugin's client muxer builds yamux's logger.
	std := l.Named("yamux").StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})
	std.Print("[ERR] yamux: Failed to write header: write unix @->/tmp/p: write: broken pipe")

	got := buf.String()
	if !strings.Contains(got, "[DEBUG] plughost.yamux: yamux: Failed to write header") || strings.Contains(got, "[ERROR]") {
		t.Errorf("yamux's [ERR] line logged as %q, want it at debug", got)
	}
	if w := words.String(); w != "" {
		t.Errorf("the plugin's last words after a yamux line = %q, want none", w)
	}

	// The plugin process's multiplexer logs at error too, as JSON on its
	// stderr, which go-plugin logs through the plugin's stderr logger with
	// the record's module.
	before := len(buf.String())
	l.Named("plugin-binary").Error("yamux: Failed to write body: use of closed network connection", "@module", "slowstart.yamux")
	if got := buf.String()[before:]; !strings.Contains(got, "[DEBUG]") || strings.Contains(got, "[ERROR]") {
		t.Errorf("the plugin's yamux record logged as %q, want it at debug", got)
	}
	if w := words.String(); w != "" {
		t.Errorf("the plugin's last words after its yamux record = %q, want none", w)
	}

	// The plugin's own stderr logger still keeps its error records.
	l.Named("plugin-binary").Error("disk on fire", "@module", "slowstart")
	if w := words.String(); !strings.Contains(w, "disk on fire") {
		t.Errorf("the plugin's last words after its error record = %q, want it kept", w)
	}
}
