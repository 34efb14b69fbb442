package plugintest_test

import (
	"os"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
)

// TestNowFollowsShift checks that Now is the wall clock moved by the
// duration the suite's environment names, whatever that is.
func TestNowFollowsShift(t *testing.T) {
	var shift time.Duration
	if s := os.Getenv(plugintest.ClockShiftEnv); s != "" {
		var err error
		if shift, err = time.ParseDuration(s); err != nil {
			t.Fatalf("%s=%q: %v", plugintest.ClockShiftEnv, s, err)
		}
	}
	if got := plugintest.ClockShift(); got != shift {
		t.Errorf("ClockShift() = %v, want %v from %s", got, shift, plugintest.ClockShiftEnv)
	}
	before := time.Now()
	got := plugintest.Now()
	after := time.Now()
	if got.Before(before.Add(shift)) || got.After(after.Add(shift)) {
		t.Errorf("Now() = %v, want between %v and %v (wall clock + %v)", got, before.Add(shift), after.Add(shift), shift)
	}
}
