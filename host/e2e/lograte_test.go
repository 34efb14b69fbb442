package e2e

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPluginLogRate checks that a plugin flooding its output, on stdout
// or through its logger on stderr, gets no more than its log_rate (plus
// log_burst) of records into the host log, that the rest are counted in
// plughost_plugin_log_dropped_lines_total and reported in the host log,
// and that another plugin keeps answering meanwhile.
func TestPluginLogRate(t *testing.T) {
	const (
		rate   = 50
		burst  = 100
		window = 2 * time.Second
		// maxRecord bounds one flood record in the host log: the
		// plugin's line of under 100 bytes and the host's prefix, keys
		// and timestamp.
		maxRecord = 512
	)
	for _, mode := range []struct{ flood, record string }{
		{"stdout", "flood line "},
		{"log", "flood record"},
	} {
		t.Run(mode.flood, func(t *testing.T) {
			extra := fmt.Sprintf("  log_rate  = %d\n  log_burst = %d\n  env {\n    FLOOD = %q\n  }", rate, burst, mode.flood)
			h := startHost(t, baseConfig("2s")+helloWith("hi")+pluginBlock("flood", "flood", extra))
			dropped := `plughost_plugin_log_dropped_lines_total{plugin="flood"}`

			// Once the host has dropped a record, the burst is spent.
			deadline := time.Now().Add(15 * time.Second)
			for {
				if v, _ := h.metric(dropped); v > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s did not move in 15s", dropped)
				}
				time.Sleep(50 * time.Millisecond)
			}
			floodRecords := func(log string) int {
				n := 0
				for _, line := range strings.Split(log, "\n") {
					if strings.Contains(line, "plugin=flood") && strings.Contains(line, mode.record) {
						n++
					}
				}
				return n
			}

			log0 := h.log.String()
			drop0, _ := h.metric(dropped)
			cpu0 := cpuTicks(t, h.cmd.Process.Pid)
			start := time.Now()
			for time.Since(start) < window {
				if code, body := h.greeting(); code != http.StatusOK {
					t.Fatalf("GET /hello/ during the flood = %d %s, want 200", code, body)
				}
				time.Sleep(50 * time.Millisecond)
			}
			elapsed := time.Since(start)
			cpu1 := cpuTicks(t, h.cmd.Process.Pid)
			log1 := h.log.String()
			drop1, _ := h.metric(dropped)

			lines := floodRecords(log1) - floodRecords(log0)
			most := int(rate*elapsed.Seconds()) + burst
			least := int(rate * elapsed.Seconds() / 2)
			grown := len(log1) - len(log0)
			t.Logf("in %v: %d flood records logged (rate %d, burst %d), %d dropped, host log grew %d bytes (%.0f B/s), host CPU %.2f of a core",
				elapsed.Round(time.Millisecond), lines, rate, burst, int(drop1-drop0), grown,
				float64(grown)/elapsed.Seconds(), float64(cpu1-cpu0)/100/elapsed.Seconds())
			if lines > most || lines < least {
				t.Errorf("host logged %d flood records in %v, want from %d to %d (log_rate %d, log_burst %d)",
					lines, elapsed, least, most, rate, burst)
			}
			// The host's own records (health checks, requests at debug)
			// come on top of the flood's: allow 64 KiB of them.
			if limit := most*maxRecord + 64<<10; grown > limit {
				t.Errorf("host log grew %d bytes in %v, want at most %d", grown, elapsed, limit)
			}
			if drop1 <= drop0 {
				t.Errorf("%s = %v after the window, %v before, want it to grow", dropped, drop1, drop0)
			}
			if !strings.Contains(log1, "dropped plugin output over its log rate") {
				t.Errorf("host log does not report the dropped records")
			}
		})
	}
}

// cpuTicks returns the user and system CPU time of process pid, in clock
// ticks (100 a second on Linux), or skips the test elsewhere.
func cpuTicks(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Skipf("no process CPU times: %v", err)
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// After the command name: state is field 3, utime 14 and stime 15.
	utime, _ := strconv.Atoi(fields[11])
	stime, _ := strconv.Atoi(fields[12])
	return utime + stime
}

var floodFigures = flag.Bool("flood-figures", false, "run TestPluginLogFloodFigures, which prints what a flooding plugin costs the host")

// TestPluginLogFloodFigures prints, for a plugin flooding stdout or its
// logger, with log_rate off and at its default, the host log's growth,
// the records that reach the host and the host's CPU. It asserts
// nothing: run it with -flood-figures for the table in
// docs/architecture.md.
func TestPluginLogFloodFigures(t *testing.T) {
	if !*floodFigures {
		t.Skip("run with -flood-figures")
	}
	const settle, window = 2 * time.Second, 4 * time.Second
	for _, flood := range []string{"stdout", "log"} {
		for _, rate := range []string{"0", "200"} {
			t.Run(flood+"/log_rate="+rate, func(t *testing.T) {
				extra := fmt.Sprintf("  log_rate = %s\n  env {\n    FLOOD = %q\n  }", rate, flood)
				h := startHost(t, baseConfig("2s")+helloWith("hi")+pluginBlock("flood", "flood", extra))
				time.Sleep(settle) // the flood starts with Configure; let it reach its pace
				dropped := `plughost_plugin_log_dropped_lines_total{plugin="flood"}`
				log0 := h.log.String()
				drop0, _ := h.metric(dropped)
				cpu0 := cpuTicks(t, h.cmd.Process.Pid)
				start := time.Now()
				time.Sleep(window)
				elapsed := time.Since(start).Seconds()
				cpu1 := cpuTicks(t, h.cmd.Process.Pid)
				log1 := h.log.String()
				drop1, _ := h.metric(dropped)
				logged := strings.Count(log1, "plugin=flood") - strings.Count(log0, "plugin=flood")
				t.Logf("host log %.3f MB/s, %.0f records/s logged, %.0f records/s reached the host, host CPU %.2f of a core",
					float64(len(log1)-len(log0))/elapsed/1e6, float64(logged)/elapsed,
					(float64(logged)+drop1-drop0)/elapsed, float64(cpu1-cpu0)/100/elapsed)
			})
		}
	}
}
