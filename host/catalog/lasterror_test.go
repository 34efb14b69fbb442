package catalog

import (
	"strings"
	"testing"
)

func TestLastWords(t *testing.T) {
	long := strings.Repeat("x", 2*maxLastLine)
	tests := []struct {
		name    string
		records []string
		want    string
	}{
		{"none", nil, ""},
		{"last lines, bounded", []string{"a", "b", "c", "d"}, "b | c | d"},
		{"a long line is cut", []string{long}, long[:maxLastLine] + "…"},
		{"the panic wins and the stack is left out", []string{"open failed", "panic: boom", "goroutine 7 [running]:", "main.main()"}, "panic: boom"},
		{"fatal error", []string{"fatal error: concurrent map writes", "goroutine 1"}, "fatal error: concurrent map writes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &lastWords{}
			for _, r := range tt.records {
				w.record(r, nil)
			}
			if got := w.String(); got != tt.want {
				t.Errorf("lastWords after %q = %q, want %q", tt.records, got, tt.want)
			}
		})
	}
	w := &lastWords{}
	w.record("open store failed", []any{"error", "disk gone", "stack", "..."})
	if got, want := w.String(), "open store failed error=disk gone"; got != want {
		t.Errorf("lastWords of a record with keys = %q, want %q", got, want)
	}
}
