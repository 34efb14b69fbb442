package main

import (
	"fmt"
	"os"
	"runtime"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		// As the wallet's: plugintest's in-process harnesses leave stdio
		// copiers that end once the GC finalizes their pipes.
		runtime.GC()
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: Errors on successful test run:", err)
			code = 1
		}
	}
	os.Exit(code)
}
