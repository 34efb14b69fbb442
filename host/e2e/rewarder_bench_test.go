package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkRewarder posts one epoch of 100,000 contributions
// (PLUGHOST_BENCH_REWARDER_CONTRIBUTIONS) through the host, at its
// default max_body_bytes (the compute route declares its own limit,
// 16 MiB), and reports the time to computed (seal, computation,
// artifacts, outbox), the time from there to settled through the real
// wallet (about 100 batch parts), the wallet's legs/s, and the
// rewarder's peak RSS. It runs once whatever b.N is.
func BenchmarkRewarder(b *testing.B) {
	n := envInt(b, "PLUGHOST_BENCH_REWARDER_CONTRIBUTIONS", 100_000, 200_000)
	dir := b.TempDir()
	h := startBenchHost(b, benchBase(dir)+`plugin "wallet" {
  path = "wallet"
}
plugin "rewarder" {
  path = "rewarder"
}
`)
	post := func(path string, body []byte, key string) (int, string) {
		req, _ := http.NewRequest("POST", h.ingress+path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		var out bytes.Buffer
		_, _ = out.ReadFrom(resp.Body)
		return resp.StatusCode, out.String()
	}
	const pool = 1_000_000_000_007
	if code, body := post("/wallet/v1/issue", fmt.Appendf(nil, `{"to":"pool","amount":%d}`, uint64(pool)), "bench-fund"); code != http.StatusOK {
		b.Fatalf("issue = %d %s", code, body)
	}
	body := []byte(rewarderInputs("bench", pool, n))
	pid := h.pluginPid(b, "rewarder")
	state := func() (rewarderManifest, bool) {
		var m rewarderManifest
		err := json.Unmarshal([]byte(getBody(b, h.ingress+"/rewarder/v1/epochs/bench")), &m)
		return m, err == nil
	}
	start := time.Now()
	if code, resp := post("/rewarder/v1/epochs/bench/compute", body, ""); code != http.StatusAccepted {
		b.Fatalf("compute = %d %s", code, resp)
	}
	var computed time.Time
	var m rewarderManifest
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(5 * time.Millisecond) {
		m, _ = state()
		if computed.IsZero() && m.Settlement.Parts > 0 {
			computed = time.Now()
		}
		if m.State == "settled" || m.State == "quarantined" || time.Now().After(deadline) {
			break
		}
	}
	settled := time.Now()
	if m.State != "settled" {
		b.Fatalf("epoch = %+v, want settled", m)
	}
	b.ReportMetric(computed.Sub(start).Seconds(), "compute-s")
	b.ReportMetric(settled.Sub(computed).Seconds(), "settle-s")
	b.ReportMetric(float64(n)/settled.Sub(computed).Seconds(), "legs/s")
	b.ReportMetric(float64(m.Settlement.Parts), "parts")
	b.ReportMetric(peakRSSMiB(b, pid), "rewarder-peak-MiB")
}

// peakRSSMiB returns a process's peak resident set size (VmHWM), in MiB.
func peakRSSMiB(tb testing.TB, pid int) float64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				tb.Fatal(err)
			}
			return kb / 1024
		}
	}
	tb.Fatal("no VmHWM in /proc/PID/status")
	return 0
}
