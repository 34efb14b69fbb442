package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/sdk/wire"
)

// TestPluginLogRate checks that a plugin flooding its output, on stdout
// or through its logger on stderr, gets no more than its log_rate (plus
// log_burst) of records into the host log, that the rest are counted in
// plughost_plugin_log_dropped_lines_total and reported in the host log,
// and that another plugin keeps answering meanwhile. The SDK's logger
// drops its excess in the plugin and reports it, which the host counts;
// a logger that is not the SDK's, and stdout, the host limits itself.
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
	const (
		hostReport = "dropped plugin output over its log rate"
		sdkReport  = wire.LogDroppedMsg
	)
	for _, mode := range []struct{ flood, record, report string }{
		{"stdout", "flood line ", hostReport},
		{"log", "flood record", sdkReport},
		{"rawlog", "flood record", hostReport},
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
			cpu0 := procCPU(t, h.cmd.Process.Pid)
			start := time.Now()
			for time.Since(start) < window {
				if code, body := h.greeting(); code != http.StatusOK {
					t.Fatalf("GET /hello/ during the flood = %d %s, want 200", code, body)
				}
				time.Sleep(50 * time.Millisecond)
			}
			elapsed := time.Since(start)
			cpu1 := procCPU(t, h.cmd.Process.Pid)
			log1 := h.log.String()
			drop1, _ := h.metric(dropped)

			lines := floodRecords(log1) - floodRecords(log0)
			most := int(rate*elapsed.Seconds()) + burst
			least := int(rate * elapsed.Seconds() / 2)
			grown := len(log1) - len(log0)
			t.Logf("in %v: %d flood records logged (rate %d, burst %d), %d dropped, host log grew %d bytes (%.0f B/s), host CPU %.2f of a core",
				elapsed.Round(time.Millisecond), lines, rate, burst, int(drop1-drop0), grown,
				float64(grown)/elapsed.Seconds(), (cpu1-cpu0).Seconds()/elapsed.Seconds())
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
			if !strings.Contains(log1, mode.report) {
				t.Errorf("host log does not report the dropped records with %q", mode.report)
			}
		})
	}
}

// BenchmarkPluginLogFlood reports, for a plugin flooding stdout, its SDK
// logger or a logger of its own, with log_rate off and at its default,
// the host log's growth, the records logged and those the plugin wrote
// (logged, or dropped by the host or by the SDK in the plugin) and the
// host's CPU, measured over a window once the flood has reached its pace
// (the table in docs/architecture.md). Run it with -benchtime 1x, as make
// bench does.
func BenchmarkPluginLogFlood(b *testing.B) {
	const settle, window = 2 * time.Second, 4 * time.Second
	for _, c := range []struct{ flood, rate string }{
		{"stdout", "0"}, {"stdout", "200"},
		{"log", "0"}, {"log", "200"},
		{"rawlog", "200"}, // a logger the SDK does not limit; at log_rate 0 it is log's
	} {
		b.Run(c.flood+"/log_rate="+c.rate, func(b *testing.B) {
			extra := fmt.Sprintf("  log_rate = %s\n  env {\n    FLOOD = %q\n  }", c.rate, c.flood)
			h := startBenchHost(b, benchHostConfig(b.TempDir())+pluginBlock("flood", "flood", extra))
			time.Sleep(settle) // the flood starts with Configure; let it reach its pace
			dropped := `plughost_plugin_log_dropped_lines_total{plugin="flood"}`
			count := func() (logBytes, logged int, drops float64) {
				log := h.log.String()
				v, _ := parseMetric(getBody(b, h.admin+"/metrics"), dropped)
				return len(log), strings.Count(log, "plugin=flood"), v
			}
			bytes0, logged0, drop0 := count()
			cpu0 := procCPU(b, h.cmd.Process.Pid)
			start := time.Now()
			time.Sleep(window) // the measured window, not a condition
			elapsed := time.Since(start).Seconds()
			cpu1 := procCPU(b, h.cmd.Process.Pid)
			bytes1, logged1, drop1 := count()
			b.ReportMetric(float64(bytes1-bytes0)/elapsed/1e6, "hostlog-MB/s")
			b.ReportMetric(float64(logged1-logged0)/elapsed, "logged/s")
			b.ReportMetric((float64(logged1-logged0)+drop1-drop0)/elapsed, "records/s")
			b.ReportMetric((cpu1-cpu0).Seconds()/elapsed, "host-cores")
		})
	}
}
