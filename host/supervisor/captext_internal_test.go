package supervisor

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestCapText: a last error or health reason longer than 4 KiB is cut at
// a character's start, with a marker saying how much went.
func TestCapText(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantLen int    // of the kept text, before the marker
		marker  string // "" for none
	}{
		{"short", "plugin exited", 13, ""},
		{"exactly 4 KiB", strings.Repeat("x", maxStatusText), maxStatusText, ""},
		{"one byte over", strings.Repeat("x", maxStatusText+1), maxStatusText, "… (1 more bytes cut)"},
		{"200 KB refusal", strings.Repeat("y", 200_000), maxStatusText, "… (195904 more bytes cut)"},
		// 4095 ASCII bytes, then a 3-byte character across the bound.
		{"character across the bound", strings.Repeat("z", maxStatusText-1) + "€tail", maxStatusText - 1, "… (7 more bytes cut)"},
	}
	for _, tt := range tests {
		got := capText(tt.in)
		kept, marker := got, ""
		if i := strings.Index(got, "…"); i >= 0 {
			kept, marker = got[:i], got[i:]
		}
		if len(kept) != tt.wantLen || marker != tt.marker || !utf8.ValidString(got) {
			t.Errorf("capText(%s) = %d bytes kept and %q, want %d and %q, valid UTF-8", tt.name, len(kept), marker, tt.wantLen, tt.marker)
		}
	}
}
