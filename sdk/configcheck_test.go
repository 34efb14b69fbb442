package sdk_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/plughost/plughost/sdk"
)

// TestConfigCheckerWhole pins Whole's range, both ends included, its
// refusal of fractions, and the value it returns: v, or lo once refused.
func TestConfigCheckerWhole(t *testing.T) {
	tests := []struct {
		v       float64
		want    int
		refusal string // "" when v passes
	}{
		{v: 1, want: 1},
		{v: 64, want: 64},
		{v: 7, want: 7},
		{v: 0, want: 1, refusal: "must be a whole number from 1 to 64, got 0"},
		{v: 65, want: 1, refusal: "must be a whole number from 1 to 64, got 65"},
		{v: 2.5, want: 1, refusal: "must be a whole number from 1 to 64, got 2.5"},
		{v: -1, want: 1, refusal: "must be a whole number from 1 to 64, got -1"},
		{v: math.NaN(), want: 1, refusal: "must be a whole number from 1 to 64, got NaN"},
		{v: math.Inf(1), want: 1, refusal: "must be a whole number from 1 to 64, got +Inf"},
		{v: 10000001, want: 1, refusal: "must be a whole number from 1 to 64, got 10000001"},
		{v: 2e7 + 0.5, want: 1, refusal: "must be a whole number from 1 to 64, got 20000000.5"},
		{v: 1e300, want: 1, refusal: "must be a whole number from 1 to 64, got 1e+300"},
	}
	for _, tt := range tests {
		var c sdk.ConfigChecker
		if got := c.Whole("retry.max_tries", tt.v, 1, 64); got != tt.want {
			t.Errorf("Whole(%v, 1, 64) = %d, want %d", tt.v, got, tt.want)
		}
		checkRefusal(t, c.Err(), "retry.max_tries", tt.refusal)
	}
}

// TestConfigCheckerDuration pins Duration's range, both ends included,
// and the value it returns: d, or lo once refused.
func TestConfigCheckerDuration(t *testing.T) {
	tests := []struct {
		d       time.Duration
		want    time.Duration
		refusal string
	}{
		{d: time.Millisecond, want: time.Millisecond},
		{d: time.Minute, want: time.Minute},
		{d: 0, want: time.Millisecond, refusal: "must be from 1ms to 1m0s, got 0s"},
		{d: time.Minute + time.Nanosecond, want: time.Millisecond, refusal: "must be from 1ms to 1m0s, got 1m0.000000001s"},
		{d: -time.Second, want: time.Millisecond, refusal: "must be from 1ms to 1m0s, got -1s"},
	}
	for _, tt := range tests {
		var c sdk.ConfigChecker
		if got := c.Duration(`upstream["web"].timeout`, sdk.Duration(tt.d), time.Millisecond, time.Minute); got != tt.want {
			t.Errorf("Duration(%v, 1ms, 1m) = %v, want %v", tt.d, got, tt.want)
		}
		checkRefusal(t, c.Err(), `upstream["web"].timeout`, tt.refusal)
	}
}

// TestConfigCheckerFirst: the first refusal is kept, whichever method
// made it, and the checks after it still return their values.
func TestConfigCheckerFirst(t *testing.T) {
	var c sdk.ConfigChecker
	if err := c.Err(); err != nil {
		t.Fatalf("Err() of a new ConfigChecker = %v, want nil", err)
	}
	c.Whole("workers", 8, 1, 64)
	c.Duration("shed_hold", sdk.Duration(-time.Second), 0, time.Hour)
	c.Refuse("origin", "must be non-empty, got %q", "")
	if got := c.Whole("queue", 100, 1, 10); got != 1 {
		t.Errorf("Whole(100, 1, 10) after a refusal = %d, want 1", got)
	}
	if got := c.Whole("queue", 5, 1, 10); got != 5 {
		t.Errorf("Whole(5, 1, 10) after a refusal = %d, want 5", got)
	}
	checkRefusal(t, c.Err(), "shed_hold", "must be from 0s to 1h0m0s, got -1s")
}

// checkRefusal checks that err is nil when refusal is "", and otherwise
// an *sdk.ConfigError with that path and message.
func checkRefusal(t *testing.T, err error, path, refusal string) {
	t.Helper()
	if refusal == "" {
		if err != nil {
			t.Errorf("Err() = %v, want nil", err)
		}
		return
	}
	var ce *sdk.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Err() = %v (%T), want an *sdk.ConfigError", err, err)
	}
	if diff := cmp.Diff(sdk.ConfigError{Attribute: path, Message: refusal}, *ce); diff != "" {
		t.Errorf("Err() mismatch (-want +got):\n%s", diff)
	}
}
