package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
	"github.com/plughost/plughost/sdk/store"
)

// BenchmarkThroughput is the workload in-process: 16 producers
// send 1 KiB messages (one per /v1/send, or ten per /v1/send/batch)
// while 16 consumers receive them in tens and ack each ten with
// /v1/ack/batch, durable. One op is one message sent, received and
// acked, so ns/op and allocs/op are per message. via=harness goes
// through plugintest (the host's ingress and data plane, in this
// process); via=mux calls the plugin's routes directly, which leaves
// only the plugin's own costs (and the load generator's). It reports
// msgs/s; the CPU time of the process per message (cpu-µs/msg, the load
// generator's included) and its threads' context switches (ctxsw/msg); from the committer's metrics, the group commits
// (fdatasyncs) per message and the operations per group; and the mean
// fdatasync of the write-ahead log (fsync-µs), the disk's share of a
// group's time. On a shared machine msgs/s is noise; the per-message
// figures are not.
//
//	go test -run '^$' -bench Throughput -benchmem -cpuprofile cpu.out ./plugins/mailbox/
func BenchmarkThroughput(b *testing.B) {
	for _, via := range []string{"harness", "mux"} {
		for _, per := range []int{1, 10} {
			b.Run(fmt.Sprintf("via=%s/send=%d", via, per), func(b *testing.B) { benchThroughput(b, via, per) })
		}
	}
}

func benchThroughput(b *testing.B, via string, perSend int) {
	const producers, consumers = 16, 16
	b.Cleanup(tuneGC(os.Getenv)) // as the plugin's binary runs
	var syncN, syncNs atomic.Int64
	hooks := &store.Hooks{}
	hooks.SetSync(func(f *os.File) error {
		t := time.Now()
		err := syscall.Fdatasync(int(f.Fd()))
		syncN.Add(1)
		syncNs.Add(int64(time.Since(t)))
		return err
	})
	storeOpts.Hooks = hooks
	b.Cleanup(func() { storeOpts.Hooks = nil })
	mb := &mailbox{}
	def := newDefinition(mb)
	hs := plugintest.New(b, def, plugintest.Options{})
	b.Cleanup(func() { _, _, _ = hs.Drain(context.Background(), time.Now().Add(5*time.Second)) })
	var h http.Handler = hs
	if via == "mux" {
		h = def.Routes
	}
	post := func(path, body string) (int, []byte) {
		req := httptest.NewRequest("POST", path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.Bytes()
	}
	payload, _ := json.Marshal(bytes.Repeat([]byte("x"), 1024))
	one := `{"topic":"bench","payload":` + string(payload) + `}`
	batch := `{"entries":[` + strings.Repeat(one+",", perSend-1) + one + `]}`
	total := int64(b.N)
	groups0, ops0 := commitCounts(b, hs)
	syncN.Store(0)
	syncNs.Store(0)

	var sent, acked atomic.Int64
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0, sw0 := time.Now(), cpuTime(), switches()
	for range producers {
		wg.Go(func() {
			for {
				n := min(int64(perSend), total-sent.Add(int64(perSend))+int64(perSend))
				if n <= 0 {
					return
				}
				for {
					var code int
					var body []byte
					if n == 1 {
						code, body = post("/v1/send", one)
					} else if n == int64(perSend) {
						code, body = post("/v1/send/batch", batch)
					} else {
						code, body = post("/v1/send/batch", `{"entries":[`+strings.Repeat(one+",", int(n)-1)+one+`]}`)
					}
					if code == 200 && !bytes.Contains(body, []byte(`"error"`)) {
						break
					}
					time.Sleep(time.Millisecond) // a 429: back off and send again
				}
			}
		})
	}
	for range consumers {
		wg.Go(func() {
			var eb strings.Builder
			for acked.Load() < total && time.Since(start) < 5*time.Minute {
				code, body := post("/v1/recv", `{"topic":"bench","max_messages":10,"visibility_ms":30000,"wait_ms":100}`)
				if code != 200 {
					continue
				}
				var r struct {
					Messages []struct {
						MsgID   string `json:"msg_id"`
						Receipt string `json:"receipt"`
					}
				}
				if json.Unmarshal(body, &r) != nil || len(r.Messages) == 0 {
					continue
				}
				eb.Reset()
				eb.WriteString(`{"entries":[`)
				for i, m := range r.Messages {
					if i > 0 {
						eb.WriteString(",")
					}
					eb.WriteString(`{"msg_id":"` + m.MsgID + `","receipt":"` + m.Receipt + `"}`)
				}
				eb.WriteString("]}")
				if code, body = post("/v1/ack/batch", eb.String()); code == 200 {
					acked.Add(int64(len(r.Messages) - bytes.Count(body, []byte(`"error"`))))
				}
			}
		})
	}
	wg.Wait()
	elapsed, cpu, sw := time.Since(start), cpuTime()-cpu0, switches()-sw0
	b.StopTimer()
	if acked.Load() < total {
		b.Fatalf("%d of %d messages acked in %v", acked.Load(), total, elapsed)
	}
	groups1, ops1 := commitCounts(b, hs)
	b.ReportMetric(float64(total)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric((groups1-groups0)/float64(total), "fsyncs/msg")
	b.ReportMetric(float64(cpu.Microseconds())/float64(total), "cpu-µs/msg")
	b.ReportMetric(float64(sw)/float64(total), "ctxsw/msg")
	b.ReportMetric(float64(syncNs.Load())/float64(max(1, syncN.Load()))/1e3, "fsync-µs")
	if g := groups1 - groups0; g > 0 {
		b.ReportMetric((ops1-ops0)/g, "ops/group")
	}
}

// commitCounts reads the committer's group commits and the operations
// they held from the plugin's metrics.
func commitCounts(b *testing.B, h *plugintest.Harness) (groups, ops float64) {
	b.Helper()
	text, err := h.Metrics(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		f, _ := strconv.ParseFloat(v, 64)
		switch name {
		case "mailbox_commit_batch_size_count":
			groups = f
		case "mailbox_commit_batch_size_sum":
			ops = f
		}
	}
	return groups, ops
}

// switches counts the context switches of this process's threads so far,
// voluntary (a thread that blocked) and involuntary.
func switches() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Nvcsw + ru.Nivcsw
}

// cpuTime is the CPU time this process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkReadyRSS fills a store with ready 1 KiB messages
// (PLUGHOST_BENCH_MAILBOX_READY, default 1,000,000) through the mailbox's
// own rules, then configures the plugin on it in-process (plugintest),
// receives from it, and reports the process's resident set and the Go
// heap in use. The issue bounds the plugin's RSS at 200 MB with a million
// ready messages; this process also holds the harness and the host's
// ingress, so its RSS is an upper bound of the plugin's. It runs once
// whatever b.N is.
//
//	go test -run '^$' -bench ReadyRSS -benchtime 1x ./plugins/mailbox/
func BenchmarkReadyRSS(b *testing.B) {
	n := 1_000_000
	if v := os.Getenv("PLUGHOST_BENCH_MAILBOX_READY"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("PLUGHOST_BENCH_MAILBOX_READY=%q: want a positive count", v)
		}
	}
	dir := b.TempDir()
	db, err := store.Open(filepath.Join(dir, storeFile), storeOpts)
	if err != nil {
		b.Fatal(err)
	}
	r := rules{maxAttempts: 5, dedup: time.Minute, floors: &floors{}}
	p := bytes.Repeat([]byte("x"), 1024)
	now := time.Now().Add(-time.Minute)
	const group = 1000
	for sent := 0; sent < n; sent += group {
		ops := make([]op, min(group, n-sent))
		for i := range ops {
			ops[i] = op{kind: opSend, topic: "ready", env: envelope{Hash: HashOf(p), Payload: p}}
		}
		if _, err := r.commit(db, now, ops); err != nil {
			b.Fatal(err)
		}
		if db.CheckpointDue() {
			if err := db.Checkpoint(); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := db.Close(); err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	debug.FreeOSMemory()

	b.ResetTimer()
	h := plugintest.New(b, definition(), plugintest.Options{DataDir: dir})
	b.Cleanup(func() { _, _, _ = h.Drain(context.Background(), time.Now().Add(5*time.Second)) })
	for range 100 {
		req := httptest.NewRequest("POST", "/v1/recv", strings.NewReader(`{"topic":"ready","max_messages":10,"visibility_ms":60000}`))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"msg_id"`) {
			b.Fatalf("recv = %d %s", rec.Code, rec.Body.String())
		}
	}
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.StopTimer()
	anon, file := rss(b)
	b.ReportMetric(float64(anon+file)/1e6, "rss-MB")
	b.ReportMetric(float64(anon)/1e6, "anon-MB")
	b.ReportMetric(float64(file)/1e6, "file-MB")
	b.ReportMetric(float64(ms.HeapInuse)/1e6, "heap-MB")
	b.ReportMetric(float64(n), "ready")
}

// rss is this process's resident set from /proc/self/status: anonymous
// memory (the heap, stacks) and file-backed pages (the binary, and the
// store's memory map), in bytes.
func rss(b *testing.B) (anon, file int64) {
	b.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Skipf("no /proc/self/status: %v", err)
	}
	kb := func(v string) int64 {
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			b.Fatalf("/proc/self/status: %q: %v", v, err)
		}
		return n << 10
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			anon = kb(v)
		} else if v, ok := strings.CutPrefix(line, "RssFile:"); ok {
			file = kb(v)
		}
	}
	return anon, file
}

// BenchmarkHashOf is the hash of a 1 KiB payload, computed at its send
// and again at each of its deliveries.
func BenchmarkHashOf(b *testing.B) {
	p := make([]byte, 1024)
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		HashOf(p)
	}
}

// BenchmarkDecodeSendBatch reads a batch of ten 1 KiB sends as
// /v1/send/batch does: its entries, then each entry's send, payload
// hashed. One op is one batch.
func BenchmarkDecodeSendBatch(b *testing.B) {
	payload, _ := json.Marshal(bytes.Repeat([]byte("x"), 1024))
	one := `{"topic":"bench","payload":` + string(payload) + `}`
	body := []byte(`{"entries":[` + strings.Repeat(one+",", 9) + one + `]}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		entries, err := batchEntries(body)
		if err != nil {
			b.Fatal(err)
		}
		for _, raw := range entries {
			if _, err := decodeSendEntry(raw, 1<<20); err != nil {
				b.Fatal(err)
			}
		}
	}
}
