package catalog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
)

// loggedLines returns the "line" field of every record a JSON hclog logger
// wrote to buf, checking each names stream.
func loggedLines(t *testing.T, buf *bytes.Buffer, stream string) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(buf)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("log record %q: %v", sc.Text(), err)
		}
		if rec["stream"] != stream || rec["@message"] != "plugin output" {
			t.Errorf("log record %v, want message %q with stream %q", rec, "plugin output", stream)
		}
		line, _ := rec["line"].(string)
		out = append(out, line)
	}
	return out
}

func TestLineLogger(t *testing.T) {
	tests := []struct {
		name   string
		writes []string
		flush  bool
		want   []string
	}{
		{name: "one line", writes: []string{"hello\n"}, want: []string{"hello"}},
		{name: "lines in one write", writes: []string{"a\nb\n\nc\n"}, want: []string{"a", "b", "", "c"}},
		{name: "line across writes", writes: []string{"he", "ll", "o\nwor", "ld\n"}, want: []string{"hello", "world"}},
		{name: "partial line waits for flush", writes: []string{"done\npartial"}, want: []string{"done"}},
		{name: "flush logs partial line", writes: []string{"done\npartial"}, flush: true, want: []string{"done", "partial"}},
		{name: "flush with nothing buffered", writes: []string{"done\n"}, flush: true, want: []string{"done"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			w := newLineLogger(hclog.New(&hclog.LoggerOptions{Output: &buf, JSONFormat: true}), "stdout", nil)
			for _, s := range tt.writes {
				if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
					t.Fatalf("Write(%q) = %d, %v, want %d, nil", s, n, err, len(s))
				}
			}
			if tt.flush {
				w.Flush()
			}
			got := loggedLines(t, &buf, "stdout")
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("logged lines mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLineLoggerBoundsPartialLine checks that a plugin printing without
// newlines cannot make the host buffer without bound.
func TestLineLoggerBoundsPartialLine(t *testing.T) {
	var buf bytes.Buffer
	w := newLineLogger(hclog.New(&hclog.LoggerOptions{Output: &buf, JSONFormat: true}), "stderr", nil)
	chunk := strings.Repeat("y", 1024)
	for range 2 * maxLine / len(chunk) {
		if _, err := w.Write([]byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	if len(w.buf) >= maxLine {
		t.Errorf("buffered %d bytes of a partial line, want fewer than %d", len(w.buf), maxLine)
	}
	w.Flush()
	got := loggedLines(t, &buf, "stderr")
	if total := len(strings.Join(got, "")); total != 2*maxLine {
		t.Errorf("logged %d bytes in %d records, want %d bytes", total, len(got), 2*maxLine)
	}
	for _, l := range got {
		if len(l) > maxLine {
			t.Errorf("logged a %d-byte record, want at most %d", len(l), maxLine)
		}
	}
}
