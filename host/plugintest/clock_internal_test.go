package plugintest

import (
	"testing"
	"time"
)

func TestParseShift(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"", 0, false},
		{"8760h", 8760 * time.Hour, false},
		{"-1h", -time.Hour, false},
		{"1y", 0, true},
		{"8760", 0, true},
	} {
		got, err := parseShift(tt.in)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("parseShift(%q) = %v, %v, want %v (error %t)", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}
