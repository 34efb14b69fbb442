package sdk

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// testChild, when a test file sets it, runs before the tests; if it
// reports that this process was started as a test's child process, the
// process exits after it instead of running the tests.
var testChild func() bool

func TestMain(m *testing.M) {
	if testChild != nil && testChild() {
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}
