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
		// As the gateway's: plugintest's in-process harnesses leave stdio
		// copiers that end once the GC finalizes their pipes, and the
		// SDK's client of the host's Host service is not closed when an
		// in-process harness stops (the SDK's to fix). go-plugin's broker
		// waits up to 5 s for a broker stream that a stopped harness never
		// opened.
		runtime.GC()
		if err := goleak.Find(
			goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
			goleak.IgnoreTopFunction("github.com/hashicorp/go-plugin.(*GRPCBroker).timeoutWait"),
		); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: Errors on successful test run:", err)
			code = 1
		}
	}
	os.Exit(code)
}
