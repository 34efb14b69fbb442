package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The wallet benchmark's knobs: issue 4's performance target.
const (
	walletBenchClients    = 64
	targetTransfersPerSec = 10_000
	// walletBenchFunds is issued to every client's source account up
	// front; each transfer moves 1, so no run can exhaust it.
	walletBenchFunds = 1 << 40
)

// BenchmarkWalletTransfers measures durable transfers per second through
// plughost and the wallet plugin: a closed loop of walletBenchClients
// clients, each with its own connection, source account, destination
// account and nonce sequence, POSTs /wallet/v1/transfer; only 200s count,
// and a 200 means the transfer is fsynced. It prints transfers/s, p50 and
// p99 latency, CPU per transfer, and the group-commit sizes the wallet
// reports in wallet_commit_batch_size over the measured window, against
// the target of issue 4. It fails when requests fail or the ledger does
// not add up afterwards, never on a missed target. The transfers go
// through rawClient, not net/http, to leave the two cores to what is
// measured.
//
// It warms up for PLUGHOST_BENCH_WARMUP (default 1s) and measures for
// PLUGHOST_BENCH_DURATION (default 5s); PLUGHOST_BENCH_WALLET_CLIENTS
// overrides the client count. Like BenchmarkHelloIngress it runs once
// whatever b.N is, and loads only 127.0.0.1.
func BenchmarkWalletTransfers(b *testing.B) {
	warmup := envDuration(b, "PLUGHOST_BENCH_WARMUP", time.Second)
	measure := envDuration(b, "PLUGHOST_BENCH_DURATION", 5*time.Second)
	clients := envInt(b, "PLUGHOST_BENCH_WALLET_CLIENTS", walletBenchClients, 1024)

	dir := b.TempDir()
	// The disk's own speed, on the wallet's file system, just before the
	// load: it swings by an order of magnitude on shared machines.
	syncBefore := fdatasyncLatency(b, dir)
	hashBefore := sha256Time()
	h := startBenchHost(b, walletBenchHostConfig(dir))
	hostPid := h.cmd.Process.Pid
	walletPid := h.pluginPid(b, "wallet")
	l := newTransferLoader(b, h.ingress, clients)
	defer l.close()
	l.fund(b)

	// CPU time of each process involved, to see where a transfer's cost
	// goes on a machine this small.
	cpu := func() [3]time.Duration {
		return [3]time.Duration{selfCPU(b), procCPU(b, hostPid), procCPU(b, walletPid)}
	}
	var res loadResult
	b.ResetTimer()
	l.run(b.Context(), warmup, nil)
	before := walletHistograms(b, h.admin)
	c0 := cpu()
	m0, machineOK := machineCPU()
	l.run(b.Context(), measure, &res)
	machine := machineLine(m0, machineOK)
	c1 := cpu()
	hostRSS, hostRSSErr := rssMB(hostPid)
	walletRSS, walletRSSErr := rssMB(walletPid)
	after := walletHistograms(b, h.admin)
	b.StopTimer()
	res.sort()
	batches := after[0].sub(before[0])
	commits := after[1].sub(before[1])
	checkpoints := after[2].sub(before[2])
	var perTransfer [3]time.Duration
	for i := range c1 {
		res.cpu += c1[i] - c0[i]
		if res.n() > 0 {
			perTransfer[i] = (c1[i] - c0[i]) / time.Duration(res.n())
		}
	}

	if res.errors > 0 || res.n() == 0 {
		b.Errorf("%d of %d transfers failed (first: %v)", res.errors, res.n()+res.errors, res.firstErr)
	}
	l.check(b)

	b.ReportMetric(res.rps(), "transfers/s")
	b.ReportMetric(micros(res.quantile(0.50)), "p50-µs")
	b.ReportMetric(micros(res.quantile(0.99)), "p99-µs")
	b.ReportMetric(micros(res.cpuPerRequest()), "CPU-µs/transfer")
	b.ReportMetric(batches.mean(), "ops/commit")

	var sb strings.Builder
	fmt.Fprintf(&sb, "\nPOST /wallet/v1/transfer through plughost, %d clients on distinct account pairs; %v warm-up, then %v measured\n",
		clients, warmup, measure)
	fmt.Fprintf(&sb, "benchmark process (load generator: raw wrk-style HTTP/1.1 client, one connection per client) GOMAXPROCS=%d, %d CPUs; load average %s\n",
		runtime.GOMAXPROCS(0), runtime.NumCPU(), loadavg())
	tpsVerdict := verdict(res.rps() >= targetTransfersPerSec)
	if clients != walletBenchClients {
		tpsVerdict = fmt.Sprintf("n/a at %d clients", clients)
	}
	fmt.Fprintf(&sb, "%-22s %14s %12s %s\n", "", "measured", "target", "")
	fmt.Fprintf(&sb, "%-22s %14.0f %12s %s\n", "durable transfers/s", res.rps(), fmt.Sprintf("≥ %d", targetTransfersPerSec), tpsVerdict)
	fmt.Fprintf(&sb, "%-22s %14v\n", "p50", roundDur(res.quantile(0.50)))
	fmt.Fprintf(&sb, "%-22s %14v\n", "p99", roundDur(res.quantile(0.99)))
	fmt.Fprintf(&sb, "%-22s %12.1fµs   load generator %.1fµs + host %.1fµs + wallet %.1fµs\n", "CPU/transfer",
		micros(res.cpuPerRequest()), micros(perTransfer[0]), micros(perTransfer[1]), micros(perTransfer[2]))
	fmt.Fprintf(&sb, "%-22s %14d   errors %d\n", "transfers", res.n(), res.errors)
	fmt.Fprintf(&sb, "%-22s %14s   host %s\n", "RSS after the load", "wallet "+fmtMB(walletRSS, walletRSSErr), fmtMB(hostRSS, hostRSSErr))
	fmt.Fprintf(&sb, "%-22s %14d   mean %.1f ops/commit; p50 %s, p90 %s, p99 %s ops (histogram buckets)\n",
		"group commits", batches.count, batches.mean(), batches.bucketOf(0.50), batches.bucketOf(0.90), batches.bucketOf(0.99))
	fmt.Fprintf(&sb, "%-22s %s\n", "commits by ops", batches.distribution())
	// The ledger commits one group at a time, fdatasync included: when it is
	// busy nearly all the time, the commit is what limits throughput;
	// otherwise the CPU is, or the clients.
	fmt.Fprintf(&sb, "%-22s %12.2fms   ledger in a commit %.0f%% of the measured time\n", "commit time (mean)",
		commits.mean()*1e3, 100*commits.sum/res.elapsed.Seconds())
	// Checkpoints run alongside commits, so the two shares overlap.
	fmt.Fprintf(&sb, "%-22s %14d   mean %.2fms; running %.0f%% of the measured time, alongside groups\n", "checkpoints",
		checkpoints.count, checkpoints.mean()*1e3, 100*checkpoints.sum/res.elapsed.Seconds())
	sb.WriteString(machine)
	fmt.Fprintf(&sb, "%-22s %14v   p50 of 200 writes of one 4 KiB page, each followed by fdatasync, before the load\n",
		"disk fdatasync", roundDur(syncBefore))
	fmt.Fprintf(&sb, "%-22s %14v   p50 of 21 SHA-256 sums of 1 MiB, before the load: compare runs by it\n",
		"CPU speed", roundDur(hashBefore))
	fmt.Print(sb.String())
}

// fdatasyncLatency returns the median time to overwrite one 4 KiB page of
// a file in dir and fdatasync it, about what a small group commit's
// write-ahead log record costs.
func fdatasyncLatency(tb testing.TB, dir string) time.Duration {
	tb.Helper()
	f, err := os.CreateTemp(dir, "fdatasync-*")
	if err != nil {
		tb.Fatal(err)
	}
	defer func() {
		_ = f.Close()
		_ = os.Remove(f.Name())
	}()
	page := make([]byte, 4096)
	lat := make([]time.Duration, 200)
	for i := range lat {
		start := time.Now()
		if _, err := f.WriteAt(page, int64(i%8)*4096); err != nil {
			tb.Fatal(err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			tb.Fatal(err)
		}
		lat[i] = time.Since(start)
	}
	slices.Sort(lat)
	return lat[len(lat)/2]
}

// sha256Time returns the median time to hash 1 MiB, a yardstick for the
// speed of the CPU the benchmark ran on.
func sha256Time() time.Duration {
	buf := make([]byte, 1<<20)
	lat := make([]time.Duration, 21)
	for i := range lat {
		start := time.Now()
		sha256.Sum256(buf)
		lat[i] = time.Since(start)
	}
	slices.Sort(lat)
	return lat[len(lat)/2]
}

// walletBenchHostConfig runs the wallet with its documented defaults and
// the env block of the repository's config.hcl, under the host's
// defaults, both listeners on ephemeral 127.0.0.1 ports.
func walletBenchHostConfig(dir string) string {
	return benchBase(dir) + `plugin "wallet" {
  path     = "wallet"
  required = true
  env {
    GOGC = "800"
  }
}
`
}

// transferPath is where BenchmarkWalletTransfers POSTs.
const transferPath = "/wallet/v1/transfer"

// transferClient is one closed-loop client of BenchmarkWalletTransfers:
// it owns its source account, the nonce sequence of it, and its
// connection.
type transferClient struct {
	from, to  string
	nonce     uint64 // acknowledged transfers
	last      []byte // the last receipt
	raw       *rawClient
	key, body []byte // of the transfer in flight; reused
}

// transferLoader drives the transfer clients over one rawClient
// connection each; fund uses net/http, since it is not measured.
type transferLoader struct {
	url     string
	ingress string
	clients []transferClient
	tr      *http.Transport
	cl      *http.Client
}

func newTransferLoader(tb testing.TB, ingress string, clients int) *transferLoader {
	tb.Helper()
	tr := &http.Transport{
		MaxIdleConns:        clients,
		MaxIdleConnsPerHost: clients,
		MaxConnsPerHost:     clients,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	l := &transferLoader{
		url:     ingress + transferPath,
		ingress: ingress,
		clients: make([]transferClient, clients),
		tr:      tr,
		cl:      &http.Client{Transport: tr, Timeout: 10 * time.Second},
	}
	for i := range l.clients {
		raw, err := newRawClient(ingress)
		if err != nil {
			tb.Fatal(err)
		}
		l.clients[i] = transferClient{from: fmt.Sprintf("bench-from-%04d", i), to: fmt.Sprintf("bench-to-%04d", i), raw: raw}
	}
	return l
}

func (l *transferLoader) close() {
	for _, c := range l.clients {
		c.raw.close()
	}
	l.tr.CloseIdleConnections()
}

// fund issues walletBenchFunds to every client's source account.
func (l *transferLoader) fund(tb testing.TB) {
	tb.Helper()
	for _, c := range l.clients {
		body := fmt.Sprintf(`{"to":%q,"amount":%d}`, c.from, uint64(walletBenchFunds))
		code, resp, err := postJSON(tb.Context(), l.cl, l.ingress+"/wallet/v1/issue", "fund-"+c.from, body)
		if err != nil || code != http.StatusOK {
			tb.Fatalf("POST /wallet/v1/issue %s = %d %s (%v), want 200", body, code, resp, err)
		}
	}
}

// run is loader.run for transfers: every client sends its next transfer
// as soon as the last one is answered 200, for d; only transfers started
// within d are sent, and the measured time runs to the last answer.
// Latency runs from a transfer's first attempt to its 200.
func (l *transferLoader) run(ctx context.Context, d time.Duration, into *loadResult) {
	start := time.Now()
	end := start.Add(d)
	ctx, cancel := context.WithDeadline(ctx, end.Add(15*time.Second))
	defer cancel()

	workers := make([]worker, len(l.clients))
	var wg sync.WaitGroup
	for i := range workers {
		w, c := &workers[i], &l.clients[i]
		w.lat = make([]time.Duration, 0, 1<<10)
		wg.Go(func() {
			for ctx.Err() == nil {
				t0 := time.Now()
				if !t0.Before(end) {
					return
				}
				errs, err := l.transfer(ctx, c)
				t1 := time.Now()
				w.last = t1
				w.errors += errs
				if w.firstErr == nil && err != nil {
					w.firstErr = err
				}
				if err != nil && !retriable(err) {
					return // the client's nonce sequence is lost; stop it
				}
				if err == nil {
					w.lat = append(w.lat, t1.Sub(t0))
				}
			}
		})
	}
	wg.Wait()
	into.add(start, workers)
}

// errTransfer is a transfer answer that is neither a 200 nor worth a
// retry; the client's nonce sequence cannot go on after it.
var errTransfer = errors.New("transfer refused")

func retriable(err error) bool { return !errors.Is(err, errTransfer) }

// transfer moves 1 from c.from to c.to with c's next nonce. It retries
// 429s, 5xx answers and transport errors with the same key and body, so
// that a transfer whose outcome was unknown is not applied twice, and
// returns how many attempts failed and the last failure when it gave up
// (ctx ended, or an answer no retry can fix).
func (l *transferLoader) transfer(ctx context.Context, c *transferClient) (int, error) {
	nonce := c.nonce + 1
	c.key = appendTransferKey(c.key[:0], c.from, nonce)
	c.body = appendTransferBody(c.body[:0], c.from, c.to, nonce)
	c.raw.setPost(transferPath, c.key, c.body)
	errs := 0
	for {
		code, resp, err := c.raw.do(ctx) // a transport error closed the connection: the retry dials again
		if err == nil && code == http.StatusOK {
			// resp is the connection's buffer, which the next answer
			// overwrites: keep the receipt in c's own.
			if c.last == nil {
				c.last = make([]byte, 0, len(resp))
			}
			c.nonce, c.last = nonce, append(c.last[:0], resp...)
			return errs, nil
		}
		errs++
		if err == nil && code != http.StatusTooManyRequests && code < 500 {
			return errs, fmt.Errorf("%w: POST %s %s = %d %s", errTransfer, l.url, c.body, code, bytes.TrimSpace(resp))
		}
		select {
		case <-ctx.Done():
			return errs, fmt.Errorf("POST %s %s: %d %s (%v), then %w", l.url, c.body, code, bytes.TrimSpace(resp), err, ctx.Err())
		case <-time.After(10 * time.Millisecond): // pace the retries
		}
	}
}

// appendTransferKey appends the Idempotency-Key of from's transfer with
// nonce: "<from>-<nonce>".
func appendTransferKey(dst []byte, from string, nonce uint64) []byte {
	dst = append(dst, from...)
	dst = append(dst, '-')
	return strconv.AppendUint(dst, nonce, 10)
}

// appendTransferBody appends the JSON body of a transfer of 1 from from
// to to with nonce, as fmt's `{"from":%q,"to":%q,"amount":1,"nonce":%d}`
// would write it.
func appendTransferBody(dst []byte, from, to string, nonce uint64) []byte {
	dst = append(dst, `{"from":`...)
	dst = strconv.AppendQuote(dst, from)
	dst = append(dst, `,"to":`...)
	dst = strconv.AppendQuote(dst, to)
	dst = append(dst, `,"amount":1,"nonce":`...)
	dst = strconv.AppendUint(dst, nonce, 10)
	return append(dst, '}')
}

// check reads every client's accounts and the supply after the run: the
// nonce of each source account is its client's count of 200s, each 200
// moved exactly 1, and the supply is what was issued.
func (l *transferLoader) check(tb testing.TB) {
	tb.Helper()
	var maxSeq uint64
	for _, c := range l.clients {
		if c.last == nil {
			continue
		}
		var rc struct {
			Seq uint64 `json:"seq"`
		}
		if err := json.Unmarshal(c.last, &rc); err != nil {
			tb.Fatalf("decode receipt %s: %v", c.last, err)
		}
		maxSeq = max(maxSeq, rc.Seq)
	}
	read := func(path string, v any) {
		tb.Helper()
		url := fmt.Sprintf("%s/wallet/v1/%s?min_seq=%d&wait=5s", l.ingress, path, maxSeq)
		if err := json.Unmarshal([]byte(getBody(tb, url)), v); err != nil {
			tb.Fatalf("GET %s: %v", url, err)
		}
	}
	type account struct {
		Balance uint64 `json:"balance"`
		Nonce   uint64 `json:"nonce"`
	}
	for _, c := range l.clients {
		var from, to account
		read("accounts/"+c.from, &from)
		read("accounts/"+c.to, &to)
		if want := (account{Balance: walletBenchFunds - c.nonce, Nonce: c.nonce}); from != want {
			tb.Errorf("account %s = %+v after %d acknowledged transfers, want %+v", c.from, from, c.nonce, want)
		}
		if want := (account{Balance: c.nonce}); to != want {
			tb.Errorf("account %s = %+v after %d acknowledged transfers, want %+v", c.to, to, c.nonce, want)
		}
	}
	var s struct {
		Issued, Burned, Supply uint64
	}
	read("supply", &s)
	if want := uint64(len(l.clients)) * walletBenchFunds; s.Issued != want || s.Supply != want || s.Burned != 0 {
		tb.Errorf("supply = %+v, want issued = supply = %d and burned 0", s, want)
	}
}

// postJSON sends one wallet POST and returns its status and body.
func postJSON(ctx context.Context, cl *http.Client, url, key, body string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := cl.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, b, nil
}

// batchHistogram is a snapshot of a histogram such as
// wallet_commit_batch_size: buckets are cumulative, by upper bound; the
// +Inf bucket is count.
type batchHistogram struct {
	count uint64
	sum   float64
	le    []float64
	cum   []uint64
}

// walletHistograms scrapes wallet_commit_batch_size,
// wallet_commit_seconds and wallet_checkpoint_seconds, in that order, for
// plugin="wallet" from the admin /metrics.
func walletHistograms(tb testing.TB, admin string) [3]batchHistogram {
	tb.Helper()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(getBody(tb, admin+"/metrics")))
	if err != nil {
		tb.Fatalf("parse /metrics: %v", err)
	}
	var hs [3]batchHistogram
	for i, name := range []string{"wallet_commit_batch_size", "wallet_commit_seconds", "wallet_checkpoint_seconds"} {
		hs[i] = histogramOf(tb, fams, name)
	}
	return hs
}

// histogramOf returns the histogram name{plugin="wallet"} in fams.
func histogramOf(tb testing.TB, fams map[string]*dto.MetricFamily, name string) batchHistogram {
	tb.Helper()
	fam, ok := fams[name]
	if !ok {
		tb.Fatalf("/metrics has no %s", name)
	}
	for _, m := range fam.GetMetric() {
		wallet := false
		for _, lp := range m.GetLabel() {
			wallet = wallet || (lp.GetName() == "plugin" && lp.GetValue() == "wallet")
		}
		if !wallet || m.GetHistogram() == nil {
			continue
		}
		hist := m.GetHistogram()
		h := batchHistogram{count: hist.GetSampleCount(), sum: hist.GetSampleSum()}
		for _, bk := range hist.GetBucket() {
			if math.IsInf(bk.GetUpperBound(), +1) {
				continue
			}
			h.le = append(h.le, bk.GetUpperBound())
			h.cum = append(h.cum, bk.GetCumulativeCount())
		}
		return h
	}
	tb.Fatalf(`/metrics has no %s histogram with plugin="wallet"`, name)
	return batchHistogram{}
}

// sub returns what h counted since o, an earlier snapshot of it.
func (h batchHistogram) sub(o batchHistogram) batchHistogram {
	d := batchHistogram{count: h.count - o.count, sum: h.sum - o.sum, le: h.le, cum: make([]uint64, len(h.cum))}
	for i := range h.cum {
		d.cum[i] = h.cum[i]
		if i < len(o.cum) {
			d.cum[i] -= o.cum[i]
		}
	}
	return d
}

// mean is the mean group size: sum / count.
func (h batchHistogram) mean() float64 {
	if h.count == 0 {
		return 0
	}
	return h.sum / float64(h.count)
}

// bucketOf names the bucket that holds the q-quantile of the group sizes,
// such as "(8,16]": the histogram knows no finer.
func (h batchHistogram) bucketOf(q float64) string {
	if h.count == 0 {
		return "n/a"
	}
	rank := uint64(math.Ceil(q * float64(h.count)))
	lo := 0.0
	for i, c := range h.cum {
		if c >= rank {
			return fmt.Sprintf("(%g,%g]", lo, h.le[i])
		}
		lo = h.le[i]
	}
	return fmt.Sprintf("(%g,+Inf)", lo)
}

// distribution lists the commits per bucket, skipping empty ones.
func (h batchHistogram) distribution() string {
	var parts []string
	var prev uint64
	lo := 0.0
	for i, c := range h.cum {
		if n := c - prev; n > 0 {
			parts = append(parts, fmt.Sprintf("(%g,%g]: %d", lo, h.le[i], n))
		}
		prev, lo = c, h.le[i]
	}
	if n := h.count - prev; n > 0 {
		parts = append(parts, fmt.Sprintf("(%g,+Inf): %d", lo, n))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "  ")
}
