package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
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

func TestTuneGC(t *testing.T) {
	tests := []struct {
		name              string
		env               map[string]string
		wantGC, wantLimit bool
	}{
		{"nothing set", nil, true, true},
		{"GOGC set", map[string]string{"GOGC": "100"}, false, true},
		{"GOMEMLIMIT set", map[string]string{"GOMEMLIMIT": "1GiB"}, true, false},
		{"both set", map[string]string{"GOGC": "off", "GOMEMLIMIT": "1GiB"}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gc0, limit0 := debug.SetGCPercent(-1), debug.SetMemoryLimit(-1)
			debug.SetGCPercent(gc0)
			restore := tuneGC(func(k string) string { return tt.env[k] })
			gc, limit := debug.SetGCPercent(-1), debug.SetMemoryLimit(-1)
			debug.SetGCPercent(gc)
			if (gc == gcPercent) != tt.wantGC || (limit == gcMemoryLimit) != tt.wantLimit {
				t.Errorf("tuneGC(%v): GC percent %d, memory limit %d; want changed %v, %v", tt.env, gc, limit, tt.wantGC, tt.wantLimit)
			}
			restore()
			if gc, limit := debug.SetGCPercent(-1), debug.SetMemoryLimit(-1); gc != gc0 || limit != limit0 {
				t.Errorf("after restore: GC percent %d, memory limit %d; want %d, %d", gc, limit, gc0, limit0)
			}
			debug.SetGCPercent(gc0)
		})
	}
}
