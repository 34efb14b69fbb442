package plugintest

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// ClockShiftEnv names the environment variable that moves the clock tests
// read (Now): a Go duration such as "8760h". Run a suite with it set to a
// year ahead to find, a year early, the tests that would expire with the
// calendar: a fixture with an absolute expiry, a certificate with a
// validity window, a recorded time compared to the present.
const ClockShiftEnv = "PLUGHOST_TEST_CLOCK_SHIFT"

var clockShift = sync.OnceValues(func() (time.Duration, error) { return parseShift(os.Getenv(ClockShiftEnv)) })

// parseShift reads a value of ClockShiftEnv: empty for none.
func parseShift(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: %w", ClockShiftEnv, s, err)
	}
	return d, nil
}

// ClockShift returns how far the clock tests read is moved from the wall
// clock: ClockShiftEnv's duration, 0 when it is unset. A value that is not
// a duration panics, so that a mistyped run fails rather than run on the
// wall clock unnoticed.
func ClockShift() time.Duration {
	d, err := clockShift()
	if err != nil {
		panic(err)
	}
	return d
}

// Now returns the time a test takes as the present: the wall clock moved
// by ClockShift. Pass it where the code under test takes a clock (an
// Options.Now), so that a run with ClockShiftEnv set makes it see that
// date. Code a test gives Now to must not mix it with time.Now. The
// monotonic reading is kept, so durations between two Now calls are
// measured as time.Since measures them.
func Now() time.Time { return time.Now().Add(ClockShift()) }
