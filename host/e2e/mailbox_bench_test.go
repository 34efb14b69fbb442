package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// targetMailboxPerSec is the target: messages sent, received and
// acked per second.
const targetMailboxPerSec = 15000

// BenchmarkMailbox sends a fixed count of 1 KiB messages
// (PLUGHOST_BENCH_MAILBOX_MESSAGES, default 30000) from 16 producers
// while 16 consumers receive them in batches of 10 and ack each batch
// with /v1/ack/batch, all durable, through the host; it reports
// messages/s from the first send to the last ack, the p99 send latency
// and the machine's steal. Producers send one message per call
// (send=1), or ten per /v1/send/batch call (send=10), as SQS producers
// batch; the send latency is then the batch call's. Each runs once
// whatever b.N is.
func BenchmarkMailbox(b *testing.B) {
	for _, per := range []int{1, 10} {
		b.Run(fmt.Sprintf("send=%d", per), func(b *testing.B) { benchMailbox(b, per) })
	}
}

func benchMailbox(b *testing.B, perSend int) {
	const producers, consumers = 16, 16
	total := envInt(b, "PLUGHOST_BENCH_MAILBOX_MESSAGES", 30000, 10_000_000)
	dir := b.TempDir()
	h := startBenchHost(b, benchBase(dir)+`plugin "mailbox" {
  path     = "mailbox"
  required = true
}
`)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: producers + consumers}, Timeout: 30 * time.Second}
	post := func(path string, body []byte) (int, []byte, error) {
		resp, err := client.Post(h.ingress+"/mailbox"+path, "application/json", bytes.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		return resp.StatusCode, out, err
	}
	payload, _ := json.Marshal(bytes.Repeat([]byte("x"), 1024))
	one := `{"topic":"bench","payload":` + string(payload) + `}`
	// send sends n messages in one call and returns how many the
	// mailbox took: a batch is answered per entry.
	send := func(n int) (int, error) {
		if perSend == 1 {
			code, _, err := post("/v1/send", []byte(one))
			if err != nil || code != 200 {
				return 0, fmt.Errorf("send: %d %v", code, err)
			}
			return 1, nil
		}
		code, body, err := post("/v1/send/batch", []byte(`{"entries":[`+strings.Repeat(one+",", n-1)+one+`]}`))
		if err != nil || code != 200 {
			return 0, fmt.Errorf("send batch: %d %v", code, err)
		}
		return n - strings.Count(string(body), `"error"`), nil
	}
	total -= total % perSend

	var sent, acked, errs atomic.Int64
	var latMu sync.Mutex
	var lats []time.Duration
	var wg sync.WaitGroup
	m0, machineOK := machineCPU()
	start := time.Now()
	b.ResetTimer()
	for range producers {
		wg.Go(func() {
			var mine []time.Duration
			for sent.Add(int64(perSend)) <= int64(total) {
				for left := perSend; left > 0; {
					t0 := time.Now()
					took, err := send(left)
					if took == left {
						mine = append(mine, time.Since(t0))
					}
					left -= took
					if err != nil || left > 0 {
						errs.Add(1)
						time.Sleep(time.Millisecond) // a 429 or 503: back off, then send what was refused again
					}
				}
			}
			latMu.Lock()
			lats = append(lats, mine...)
			latMu.Unlock()
		})
	}
	for range consumers {
		wg.Go(func() {
			for acked.Load() < int64(total) && time.Since(start) < 5*time.Minute {
				code, body, err := post("/v1/recv", []byte(`{"topic":"bench","max_messages":10,"visibility_ms":30000,"wait_ms":100}`))
				if err != nil || code != 200 {
					errs.Add(1)
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
				var eb strings.Builder
				eb.WriteString(`{"entries":[`)
				for i, m := range r.Messages {
					if i > 0 {
						eb.WriteString(",")
					}
					fmt.Fprintf(&eb, `{"msg_id":%q,"receipt":%q}`, m.MsgID, m.Receipt)
				}
				eb.WriteString("]}")
				code, body, err = post("/v1/ack/batch", []byte(eb.String()))
				if err != nil || code != 200 {
					errs.Add(1)
					continue
				}
				acked.Add(int64(len(r.Messages) - strings.Count(string(body), `"error"`)))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	machine := machineLine(m0, machineOK)
	if acked.Load() < int64(total) {
		b.Fatalf("%d of %d messages acked in %v", acked.Load(), total, elapsed)
	}
	slices.Sort(lats)
	p99 := lats[len(lats)*99/100]
	rate := float64(total) / elapsed.Seconds()
	b.ReportMetric(rate, "msgs/s")
	b.ReportMetric(micros(p99), "send-p99-µs")
	b.Logf("\n%d 1 KiB messages sent by %d producers %d per call, received in tens and batch-acked by %d consumers, durable, through plughost\n"+
		"%-22s %14.0f %12s %s\n%-22s %14v\n%-22s %14d\n%s",
		total, producers, perSend, consumers,
		"messages/s", rate, fmt.Sprintf("≥ %d", targetMailboxPerSec), verdict(rate >= targetMailboxPerSec),
		"send p99", roundDur(p99), "refused or failed", errs.Load(), machine)
}
