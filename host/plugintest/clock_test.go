package plugintest_test

import (
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
)

// TestNowFollowsShift checks that Now is the wall clock moved by the
// shift the suite runs with, whatever that is.
func TestNowFollowsShift(t *testing.T) {
	shift := plugintest.ClockShift()
	before := time.Now()
	got := plugintest.Now()
	after := time.Now()
	if got.Before(before.Add(shift)) || got.After(after.Add(shift)) {
		t.Errorf("Now() = %v, want between %v and %v (wall clock + %v)", got, before.Add(shift), after.Add(shift), shift)
	}
	t.Logf("%s=%v", plugintest.ClockShiftEnv, shift)
}
