package e2e

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkReload measures what a reload costs the requests under way: a
// closed loop of 6 connections (hello GETs, wallet GETs and issues) runs
// for PLUGHOST_BENCH_DURATION (default 5s) untouched, then through
// PLUGHOST_BENCH_ROUNDS (default 3) SIGHUPs that each change both
// plugins' config, so that hello is replaced beside its old process and
// the wallet, single-instance, in turn. It prints the requests that
// failed (target 0) and the p99 latency of the requests that ended during
// the reloads (from each SIGHUP to 500ms after the host logged the reload
// done) against the steady p99 of the same run (target at most 2x). It
// fails only when a request fails. Only 127.0.0.1 is loaded.
func BenchmarkReload(b *testing.B) {
	steady := envDuration(b, "PLUGHOST_BENCH_DURATION", 5*time.Second)
	rounds := envInt(b, "PLUGHOST_BENCH_ROUNDS", 3, 20)
	const settle = 500 * time.Millisecond
	dir := copyPlugins(b, "hello", "wallet")
	h := startBenchHost(b, zeroDowntimeConfig(dir, "g0", "24h"))
	targets := []loadTarget{helloLoad, helloLoad, helloLoad, walletReadLoad, walletIssueLoad, walletIssueLoad}
	b.ResetTimer()
	load := startSteadyLoad(b, h.ingress, targets, 1<<22, steady+time.Duration(rounds)*45*time.Second)
	// The load runs while the benchmark waits: the wait is the
	// measurement.
	time.Sleep(time.Second) // warm-up, not measured
	s0 := time.Now()
	time.Sleep(steady)
	s1 := time.Now()
	type window struct{ from, to time.Time }
	var windows []window
	var took []time.Duration
	for r := range rounds {
		ttl := []string{"12h", "24h"}[r%2]
		if err := os.WriteFile(h.cfgPath, []byte(zeroDowntimeConfig(dir, fmt.Sprintf("g%d", r+1), ttl)), 0o644); err != nil {
			b.Fatal(err)
		}
		n := strings.Count(h.log.String(), "config reloaded")
		from := time.Now()
		if err := h.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			b.Fatal(err)
		}
		deadline := from.Add(30 * time.Second)
		for strings.Count(h.log.String(), "config reloaded") == n {
			if time.Now().After(deadline) {
				b.Fatalf("reload %d not done 30s after SIGHUP:\n%s", r+1, h.log.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		took = append(took, time.Since(from))
		time.Sleep(settle)
		windows = append(windows, window{from, time.Now()})
	}
	load.halt()
	b.StopTimer()

	steadyLat := load.latencies(s0, s1)
	var reloadLat []time.Duration
	for _, w := range windows {
		reloadLat = append(reloadLat, load.latencies(w.from, w.to)...)
	}
	slices.Sort(reloadLat)
	q := func(lat []time.Duration, p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(math.Ceil(p*float64(len(lat))))-1)]
	}
	load.mu.Lock()
	failed, failures, counts := load.failed, slices.Clone(load.failures), load.counts
	load.mu.Unlock()
	if failed > 0 {
		b.Errorf("%d requests failed during the reloads, want 0; the first: %q", failed, failures)
	}
	ratio := float64(q(reloadLat, 0.99)) / float64(q(steadyLat, 0.99))
	b.ReportMetric(float64(failed), "failed")
	b.ReportMetric(micros(q(steadyLat, 0.99)), "steady-p99-µs")
	b.ReportMetric(micros(q(reloadLat, 0.99)), "reload-p99-µs")
	b.ReportMetric(ratio, "reload/steady-p99")

	var sb strings.Builder
	fmt.Fprintf(&sb, "\nreload under load: %d connections (3 hello GET, 1 wallet GET, 2 wallet issue); %v steady, then %d reloads changing both plugins\n",
		len(targets), steady, rounds)
	fmt.Fprintf(&sb, "load average %s\n", loadavg())
	fmt.Fprintf(&sb, "%-16s %10s %10s %10s\n", "window", "requests", "p50", "p99")
	fmt.Fprintf(&sb, "%-16s %10d %10v %10v\n", "steady", len(steadyLat), roundDur(q(steadyLat, 0.5)), roundDur(q(steadyLat, 0.99)))
	fmt.Fprintf(&sb, "%-16s %10d %10v %10v\n", "during reloads", len(reloadLat), roundDur(q(reloadLat, 0.5)), roundDur(q(reloadLat, 0.99)))
	fmt.Fprintf(&sb, "reload took (SIGHUP to done): %v\n", took)
	fmt.Fprintf(&sb, "failed requests %d (target 0): %s; reload p99 / steady p99 %.2f (target ≤ 2): %s\n",
		failed, verdict(failed == 0), ratio, verdict(ratio <= 2))
	fmt.Fprintf(&sb, "by request and status: %v\n", counts)
	fmt.Print(sb.String())
}
