package exchange_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/plughost/plughost/host/catalog"
	"github.com/plughost/plughost/host/exchange"
	"github.com/plughost/plughost/host/internal/testbin"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

// bin is the directory TestMain builds the plugin binaries into.
var bin string

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testbin.BuildFirst(m, "exchange", &bin,
		"./plugins/hello",
		"./host/e2e/testdata/plugins/caller",
		"./host/e2e/testdata/plugins/faulty",
		"./host/exchange/testdata/legacy",
	))
}

// handleCounter is a plugin's real client that counts Handle calls, so a
// test can tell which way a request went.
type handleCounter struct {
	pluginv1.PluginClient
	n         atomic.Int64 // Handle calls
	exchanges atomic.Int64 // Exchange streams opened
}

func (c *handleCounter) Handle(ctx context.Context, req *pluginv1.HTTPRequest, opts ...grpc.CallOption) (*pluginv1.HTTPResponse, error) {
	c.n.Add(1)
	return c.PluginClient.Handle(ctx, req, opts...)
}

func (c *handleCounter) Exchange(ctx context.Context, opts ...grpc.CallOption) (pluginv1.Plugin_ExchangeClient, error) {
	c.exchanges.Add(1)
	return c.PluginClient.Exchange(ctx, opts...)
}

// transport is what a test's pool sends requests over.
type transport string

const (
	grpcStreams transport = "exchange_streams" // Exchange streams
	dataPlane   transport = "data_plane"       // the process's data-plane connections
)

// forTransports runs test once over each transport.
func forTransports(t *testing.T, test func(t *testing.T, tr transport)) {
	for _, tr := range []transport{grpcStreams, dataPlane} {
		t.Run(string(tr), func(t *testing.T) { test(t, tr) })
	}
}

// plugin is a configured plugin process and a pool in front of it.
type plugin struct {
	inst *catalog.Instance
	rpc  *handleCounter
	pool *exchange.Pool
	// exchangesExpected is set by a test that breaks data-plane
	// connections, after which Exchange streams replace them.
	exchangesExpected bool
}

// launch starts the plugin binary name with config and a pool of the given
// number of streams over tr. Cleanup closes the pool and kills the process.
func launch(t *testing.T, name, config string, tr transport, streams int) *plugin {
	t.Helper()
	inst, err := catalog.Launch(t.Context(), filepath.Join(bin, name), "", catalog.Options{
		Logger:       hclog.NewNullLogger(),
		StartTimeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatalf("launch %s: %v", name, err)
	}
	t.Cleanup(inst.Kill)
	limits := &pluginv1.Limits{MaxBodyBytes: 1 << 20, RequestTimeoutMs: 30_000}
	if err := inst.Configure(t.Context(), name, []byte(config), t.TempDir(), limits); err != nil {
		t.Fatalf("configure %s: %v", name, err)
	}
	p := &plugin{inst: inst, rpc: &handleCounter{PluginClient: inst.RPC()}}
	switch data := inst.TakeDataPlane(); tr {
	case grpcStreams:
		for _, c := range data {
			_ = c.Close()
		}
		p.pool = exchange.NewSize(p.rpc, streams)
	case dataPlane:
		if len(data) < streams {
			t.Fatalf("the plugin serves %d data-plane connections, want at least %d", len(data), streams)
		}
		for _, c := range data[streams:] {
			_ = c.Close()
		}
		p.pool = exchange.New(p.rpc, data[:streams])
	}
	t.Cleanup(p.pool.Close)
	if tr == dataPlane {
		t.Cleanup(func() {
			if n := p.rpc.exchanges.Load(); n != 0 && !p.exchangesExpected {
				t.Errorf("the pool opened %d Exchange streams, want none: its data-plane connections carry every request", n)
			}
		})
	}
	return p
}

func hello(t *testing.T, tr transport, streams int) *plugin {
	t.Helper()
	return launch(t, "hello", `{"greeting":"hi"}`, tr, streams)
}

func get(path, query string) *pluginv1.HTTPRequest {
	return &pluginv1.HTTPRequest{Method: "GET", Path: path, RawQuery: query}
}

// outcome is what a Handle running in the background returned.
type outcome struct {
	resp *pluginv1.HTTPResponse
	err  error
	took time.Duration
}

// goHandle runs Handle in a goroutine that the test's cleanup waits for.
func goHandle(t *testing.T, ctx context.Context, pool *exchange.Pool, req *pluginv1.HTTPRequest) <-chan outcome {
	t.Helper()
	out := make(chan outcome, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		start := time.Now()
		resp, err := pool.Handle(ctx, req)
		out <- outcome{resp, err, time.Since(start)}
	})
	t.Cleanup(wg.Wait)
	return out
}

func receive(t *testing.T, ch <-chan outcome, what string) outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out after 30s waiting for %s", what)
		return outcome{}
	}
}

// waitFor polls cond until it holds or 30s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 30s waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sleeps returns hello_sleeps_total: how many /sleep handlers have started.
func (p *plugin) sleeps(t *testing.T) float64 {
	t.Helper()
	resp, err := p.inst.RPC().Metrics(t.Context(), &pluginv1.MetricsRequest{})
	if err != nil {
		t.Fatalf("Metrics() = %v", err)
	}
	for _, b := range resp.GetFamilies() {
		var mf dto.MetricFamily
		if err := proto.Unmarshal(b, &mf); err != nil {
			t.Fatalf("decode metric family: %v", err)
		}
		if mf.GetName() == "hello_sleeps_total" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

func TestConcurrentCallers(t *testing.T) { forTransports(t, testConcurrentCallers) }

func testConcurrentCallers(t *testing.T, tr transport) {
	p := hello(t, tr, 2)
	const n = 200
	outs := make([]<-chan outcome, n)
	start := time.Now()
	for i := range outs {
		// Different answers, so that each caller must get its own.
		outs[i] = goHandle(t, t.Context(), p.pool, get("/sleep", fmt.Sprintf("ms=%d", 100+i%50)))
	}
	for i, ch := range outs {
		o := receive(t, ch, "a concurrent request")
		want := fmt.Sprintf(`{"slept_ms":%d}`+"\n", 100+i%50)
		if o.err != nil || o.resp.GetStatus() != 200 || string(o.resp.GetBody()) != want {
			t.Errorf("Handle(/sleep?ms=%d) = %v %q, %v, want 200 %q", 100+i%50, o.resp.GetStatus(), o.resp.GetBody(), o.err, want)
		}
	}
	// One after the other they would take over 20s.
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("%d concurrent 100-150ms requests took %v, want them served at once", n, took)
	}
	if got := p.rpc.n.Load(); got != 0 {
		t.Errorf("Handle calls = %d, want 0: every request goes over Exchange", got)
	}
}

func TestDeadline(t *testing.T) { forTransports(t, testDeadline) }

func testDeadline(t *testing.T, tr transport) {
	p := launch(t, "caller", `{"target":"hello"}`, tr, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := p.pool.Handle(ctx, get("/slow", "ms=60000"))
	took := time.Since(start)
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("Handle(/slow) past its deadline = %v, want code %v", err, codes.DeadlineExceeded)
	}
	if took < 190*time.Millisecond || took > 10*time.Second {
		t.Errorf("Handle(/slow) with a 200ms deadline returned after %v", took)
	}
	// The handler saw its context end.
	waitFor(t, "the plugin to see the request's deadline", func() bool {
		resp, err := p.pool.Handle(t.Context(), get("/cancelled", ""))
		return err == nil && string(resp.GetBody()) == `{"cancelled":1}`+"\n"
	})
}

func TestCancel(t *testing.T) { forTransports(t, testCancel) }

func testCancel(t *testing.T, tr transport) {
	p := hello(t, tr, 1)
	ctx, cancel := context.WithCancel(t.Context())
	out := goHandle(t, ctx, p.pool, get("/sleep", "ms=60000"))
	waitFor(t, "the sleep to start", func() bool { return p.sleeps(t) == 1 })
	cancel()
	if o := receive(t, out, "the cancelled request"); status.Code(o.err) != codes.Canceled {
		t.Errorf("Handle(/sleep) after cancel = %v, want code %v", o.err, codes.Canceled)
	}
	// The handler returned: a drain finds nothing in flight, rather than
	// waiting for the sleep until the drain deadline.
	resp, err := p.inst.RPC().Drain(t.Context(), &pluginv1.DrainRequest{DeadlineUnixNano: time.Now().Add(20 * time.Second).UnixNano()})
	if err != nil || resp.GetAbandoned() != 0 {
		t.Errorf("Drain() after the cancel = %v, %v, want nothing abandoned", resp, err)
	}
}

func TestPluginKilled(t *testing.T) { forTransports(t, testPluginKilled) }

func testPluginKilled(t *testing.T, tr transport) {
	p := hello(t, tr, 2)
	const n = 20
	outs := make([]<-chan outcome, n)
	for i := range outs {
		outs[i] = goHandle(t, t.Context(), p.pool, get("/sleep", "ms=60000"))
	}
	waitFor(t, "the sleeps to start", func() bool { return p.sleeps(t) == n })
	if err := syscall.Kill(p.inst.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	p.exchangesExpected = true // to replace the broken connections
	for _, ch := range outs {
		o := receive(t, ch, "a request to the killed plugin")
		if status.Code(o.err) != codes.Unavailable {
			t.Errorf("Handle(/sleep) while the plugin is killed = %v, want code %v", o.err, codes.Unavailable)
		}
	}
	if took := time.Since(killed); took > 5*time.Second {
		t.Errorf("pending requests failed %v after the kill, want promptly", took)
	}
	if _, err := p.pool.Handle(t.Context(), get("/", "")); status.Code(err) != codes.Unavailable {
		t.Errorf("Handle(/) after the kill = %v, want code %v", err, codes.Unavailable)
	}
}

func TestClose(t *testing.T) { forTransports(t, testClose) }

func testClose(t *testing.T, tr transport) {
	p := hello(t, tr, 2)
	out := goHandle(t, t.Context(), p.pool, get("/sleep", "ms=60000"))
	waitFor(t, "the sleep to start", func() bool { return p.sleeps(t) == 1 })
	p.pool.Close()
	if o := receive(t, out, "the request pending at Close"); status.Code(o.err) != codes.Unavailable {
		t.Errorf("Handle(/sleep) pending at Close = %v, want code %v", o.err, codes.Unavailable)
	}
	if _, err := p.pool.Handle(t.Context(), get("/", "")); status.Code(err) != codes.Unavailable {
		t.Errorf("Handle(/) after Close = %v, want code %v", err, codes.Unavailable)
	}
}

// TestFallback checks that a plugin built before Exchange, which answers
// it Unimplemented, is served by Handle, the first requests included.
func TestFallback(t *testing.T) {
	p := launch(t, "legacy", `{}`, grpcStreams, 2)
	const n = 50
	outs := make([]<-chan outcome, n)
	for i := range outs {
		outs[i] = goHandle(t, t.Context(), p.pool, get("/", ""))
	}
	for _, ch := range outs {
		o := receive(t, ch, "a request to the legacy plugin")
		if o.err != nil || o.resp.GetStatus() != 200 || string(o.resp.GetBody()) != "legacy" {
			t.Errorf("Handle(/) = %v %q, %v, want 200 legacy", o.resp.GetStatus(), o.resp.GetBody(), o.err)
		}
	}
	if got := p.rpc.n.Load(); got != n {
		t.Errorf("Handle calls = %d, want %d", got, n)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := p.pool.Handle(ctx, get("/sleep", "ms=60000")); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("Handle(/sleep) past its deadline = %v, want code %v", err, codes.DeadlineExceeded)
	}
}

func TestLargeBody(t *testing.T) { forTransports(t, testLargeBody) }

func testLargeBody(t *testing.T, tr transport) {
	p := launch(t, "faulty", `{"label":"x","limit":3}`, tr, 1)
	tests := []struct {
		size      int
		wantCalls int64 // Handle calls it makes
	}{
		{size: exchange.MaxBodyBytes, wantCalls: 0},
		{size: exchange.MaxBodyBytes + 1, wantCalls: 1},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.size), func(t *testing.T) {
			body := bytes.Repeat([]byte("b"), tt.size)
			before := p.rpc.n.Load()
			resp, err := p.pool.Handle(t.Context(), &pluginv1.HTTPRequest{Method: "POST", Path: "/echo", Body: body})
			if err != nil || resp.GetStatus() != 200 || !bytes.Equal(resp.GetBody(), body) {
				t.Errorf("Handle(POST /echo, %d bytes) = %v, %d bytes, %v, want 200 echoing it", tt.size, resp.GetStatus(), len(resp.GetBody()), err)
			}
			if got := p.rpc.n.Load() - before; got != tt.wantCalls {
				t.Errorf("Handle(POST /echo, %d bytes) made %d Handle calls, want %d", tt.size, got, tt.wantCalls)
			}
		})
	}
}

// TestUnencodable checks that a request gRPC cannot encode fails alone and
// leaves the stream, and the request on it, alone.
func TestUnencodable(t *testing.T) { forTransports(t, testUnencodable) }

func testUnencodable(t *testing.T, tr transport) {
	p := hello(t, tr, 1)
	out := goHandle(t, t.Context(), p.pool, get("/sleep", "ms=300"))
	waitFor(t, "the sleep to start", func() bool { return p.sleeps(t) == 1 })
	bad := get("/", "")
	bad.Headers = []*pluginv1.Header{{Name: "X-Bad", Values: []string{"\xff"}}}
	if _, err := p.pool.Handle(t.Context(), bad); status.Code(err) != codes.Internal {
		t.Errorf("Handle(/) with a header that is not UTF-8 = %v, want code %v", err, codes.Internal)
	}
	if o := receive(t, out, "the sleep"); o.err != nil || o.resp.GetStatus() != 200 {
		t.Errorf("Handle(/sleep) on the same stream = %v, %v, want 200", o.resp.GetStatus(), o.err)
	}
	resp, err := p.pool.Handle(t.Context(), get("/", ""))
	var body map[string]string
	if err != nil || json.Unmarshal(resp.GetBody(), &body) != nil || body["greeting"] != "hi" {
		t.Errorf("Handle(/) after it = %v, %v, want the greeting", resp, err)
	}
}

// TestDataPlaneBroken checks that when a data-plane connection breaks, an
// Exchange stream takes its place and requests go on being served.
func TestDataPlaneBroken(t *testing.T) {
	p := hello(t, dataPlane, 2)
	p.exchangesExpected = true
	if !p.greetAll(t, 4, "before the break") {
		t.FailNow()
	}
	if n := p.rpc.exchanges.Load(); n != 0 {
		t.Fatalf("Exchange streams before the break = %d, want 0", n)
	}
	if n := p.pool.DataPlaneConns(); n != 2 {
		t.Errorf("DataPlaneConns() before the break = %d, want 2", n)
	}
	out := goHandle(t, t.Context(), p.pool, get("/sleep", "ms=60000"))
	waitFor(t, "the sleep to start", func() bool { return p.sleeps(t) == 1 })
	exchange.BreakStreams(p.pool)
	if o := receive(t, out, "the request on the broken connection"); status.Code(o.err) != codes.Unavailable {
		t.Errorf("Handle(/sleep) on a connection that broke = %v, want code %v", o.err, codes.Unavailable)
	}
	p.greetAll(t, 4, "after the break")
	if n := p.rpc.exchanges.Load(); n != 2 {
		t.Errorf("Exchange streams after both connections broke = %d, want 2", n)
	}
	if n := p.pool.DataPlaneConns(); n != 0 {
		t.Errorf("DataPlaneConns() after the break = %d, want 0", n)
	}
}

// greetAll sends GET / n times, one after the other, reports each answer
// that is not 200, and returns whether all were.
func (p *plugin) greetAll(t *testing.T, n int, when string) bool {
	t.Helper()
	ok := true
	for i := range n {
		if resp, err := p.pool.Handle(t.Context(), get("/", "")); err != nil || resp.GetStatus() != 200 {
			t.Errorf("Handle(/) #%d %s = %v, %v, want 200", i, when, resp, err)
			ok = false
		}
	}
	return ok
}
