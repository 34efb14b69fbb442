package sdk

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/plughost/plughost/host/dataplane"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/internal/wiretest"
)

func TestDrainWaitsForInFlight(t *testing.T) {
	started := make(chan struct{})
	release := wiretest.NewGate(t)
	hookDeadline := make(chan time.Time, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		close(started)
		release.Wait(r)
		io.WriteString(w, "slow done")
	})
	mux.Handle("/fast", okHandler())
	p := pluginWith(mux)
	p.Routes = muxWith(func(m *Mux) {
		m.Handle("/slow", mux)
		m.Handle("/fast", mux)
		m.Handle("/events", mux, Streaming())
	})
	p.Health = func(context.Context) Health { return Health{Status: StatusReady} }
	p.Drain = func(ctx context.Context) error {
		dl, _ := ctx.Deadline()
		hookDeadline <- dl
		return nil
	}
	tp := startPlugin(t, p)

	slow := tp.goHandle(t.Context(), &dataplane.Request{Method: "GET", Path: "/slow"})
	waitFor(t, started, "the slow handler to start")

	// Far off: the checks below run while the slow request holds the
	// drain open, and must all be done before the deadline would end it.
	deadline := time.Now().Add(time.Minute)
	drained := make(chan struct{})
	var (
		drainResp *pluginv1.DrainResponse
		drainErr  error
	)
	tp.goCall(func() {
		defer close(drained)
		drainResp, drainErr = tp.client.Drain(t.Context(), &pluginv1.DrainRequest{DeadlineUnixNano: deadline.UnixNano()})
	})
	// The hook runs once new requests are refused.
	if got := waitFor(t, hookDeadline, "the Drain hook"); !got.Equal(deadline) {
		t.Errorf("Drain hook ctx deadline = %v, want %v", got, deadline)
	}

	// While draining: new requests are refused unrun, streaming ones too,
	// so that the host can send them to the instance replacing this one;
	// health says why.
	if resp, err := tp.handle(t.Context(), &dataplane.Request{Method: "GET", Path: "/fast"}); !errors.Is(err, dataplane.ErrRefused) {
		t.Errorf("handle(/fast) while draining = %v, %v, want %v", resp, err, dataplane.ErrRefused)
	}
	if head, _, err := tp.handleStream(t.Context(), &dataplane.Request{Method: "GET", Path: "/events", Streaming: true}); !errors.Is(err, dataplane.ErrRefused) {
		t.Errorf("handleStream(/events) while draining = %v, %v, want %v", head, err, dataplane.ErrRefused)
	}
	// Where the ResponseWriter cannot refuse, the answer is 503 draining.
	rec := httptest.NewRecorder()
	tp.srv.ServeHTTP(rec, httptest.NewRequest("GET", "/fast", nil))
	checkDraining(t, "ServeHTTP(/fast) to a recorder", rec.Code, rec.Header(), rec.Body.Bytes())
	health, err := tp.client.Health(t.Context(), &pluginv1.HealthRequest{})
	if err != nil || health.GetStatus() != pluginv1.HealthResponse_STATUS_NOT_READY || health.GetReason() != "draining" {
		t.Errorf("Health() while draining = %v, %v, want NOT_READY draining", health, err)
	}
	select {
	case <-drained:
		t.Fatal("Drain() returned while a request was in flight")
	default:
	}

	release.Open()
	sresp, err := slow.wait(t)
	if err != nil || sresp.status != http.StatusOK || string(sresp.body) != "slow done" {
		t.Errorf("in-flight handle(/slow) = %v, %v, want 200 slow done", sresp, err)
	}
	waitFor(t, drained, "Drain to return")
	if drainErr != nil {
		t.Fatalf("Drain() = %v", drainErr)
	}
	if drainResp.GetCompleted() != 1 || drainResp.GetAbandoned() != 0 {
		t.Errorf("Drain() = completed %d abandoned %d, want 1 and 0", drainResp.GetCompleted(), drainResp.GetAbandoned())
	}
}

// TestCloseAfterInFlight drains a plugin with a request in flight: its
// Close hook runs once, after the Drain hook and after the request has
// finished, not before; a second drain runs Drain again, not Close.
func TestCloseAfterInFlight(t *testing.T) {
	started := make(chan struct{})
	release := wiretest.NewGate(t)
	var mu sync.Mutex
	var order []string
	note := func(s string) {
		mu.Lock()
		order = append(order, s)
		mu.Unlock()
	}
	p := pluginWith(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		release.Wait(r)
		note("request done")
	}))
	drainHook := make(chan struct{}, 2)
	p.Drain = func(context.Context) error { note("drain"); drainHook <- struct{}{}; return nil }
	p.Close = func(context.Context) error { note("close"); return nil }
	tp := startPlugin(t, p)
	slow := tp.goHandle(t.Context(), &dataplane.Request{Method: "GET", Path: "/"})
	waitFor(t, started, "the handler to start")
	drained := make(chan struct{})
	tp.goCall(func() {
		defer close(drained)
		if _, err := tp.client.Drain(t.Context(), &pluginv1.DrainRequest{DeadlineUnixNano: time.Now().Add(time.Minute).UnixNano()}); err != nil {
			t.Errorf("Drain() = %v", err)
		}
	})
	waitFor(t, drainHook, "the Drain hook")
	release.Open()
	if _, err := slow.wait(t); err != nil {
		t.Fatal(err)
	}
	waitFor(t, drained, "Drain to return")
	if _, err := tp.client.Drain(t.Context(), &pluginv1.DrainRequest{}); err != nil {
		t.Fatalf("second Drain() = %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]string{"drain", "request done", "close", "drain"}, order); diff != "" {
		t.Errorf("order of the hooks and the request (-want +got):\n%s", diff)
	}
}

func checkDraining(t *testing.T, call string, st int, h http.Header, body []byte) {
	t.Helper()
	if st != http.StatusServiceUnavailable {
		t.Errorf("%s while draining: status = %d, want %d", call, st, http.StatusServiceUnavailable)
	}
	if got := h.Get("Retry-After"); got == "" {
		t.Errorf("%s while draining: Retry-After = %q, want it set", call, got)
	}
	if got := decodeError(t, body).Error.Code; got != "draining" {
		t.Errorf("%s while draining: error code = %q, want %q", call, got, "draining")
	}
}

func TestDrainAbandons(t *testing.T) {
	started := make(chan struct{})
	stuck := wiretest.NewGate(t)
	tp := startPlugin(t, pluginWith(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		stuck.Wait(r)
	})))
	c := tp.goHandle(t.Context(), &dataplane.Request{Method: "GET", Path: "/"})
	waitFor(t, started, "the handler to start")

	const grace = 200 * time.Millisecond
	begin := time.Now()
	resp, err := tp.client.Drain(t.Context(), &pluginv1.DrainRequest{DeadlineUnixNano: begin.Add(grace).UnixNano()})
	took := time.Since(begin)
	if err != nil {
		t.Fatalf("Drain() = %v", err)
	}
	if resp.GetCompleted() != 0 || resp.GetAbandoned() != 1 {
		t.Errorf("Drain() = completed %d abandoned %d, want 0 and 1", resp.GetCompleted(), resp.GetAbandoned())
	}
	if took < grace-10*time.Millisecond || took > 2*time.Second {
		t.Errorf("Drain() took %v, want about the %v to its deadline", took, grace)
	}
	// An abandoned request may still finish; the host kills the plugin.
	stuck.Open()
	if resp, err := c.wait(t); err != nil || resp.status != http.StatusOK {
		t.Errorf("abandoned handle() = %v, %v, want 200 once released", resp, err)
	}
}

func TestDrain(t *testing.T) {
	hookErr := errors.New("flush failed")
	tests := []struct {
		name     string
		hook     func(context.Context) error
		deadline time.Duration // from now; zero sends none
		wantLog  string
	}{
		{name: "idle without deadline"},
		{name: "idle with deadline", deadline: time.Minute},
		{name: "hook error is logged", hook: func(context.Context) error { return hookErr }, wantLog: "drain hook failed"},
		{name: "deadline in the past", deadline: -time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pluginWith(okHandler())
			p.Drain = tt.hook
			tp := startPlugin(t, p)
			req := &pluginv1.DrainRequest{}
			if tt.deadline != 0 {
				req.DeadlineUnixNano = time.Now().Add(tt.deadline).UnixNano()
			}
			for i := range 2 { // a second Drain is harmless
				resp, err := tp.client.Drain(t.Context(), req)
				if err != nil || resp.GetCompleted() != 0 || resp.GetAbandoned() != 0 {
					t.Errorf("Drain() #%d = %v, %v, want completed 0 abandoned 0", i+1, resp, err)
				}
			}
			if tt.wantLog != "" {
				recs := tp.logs.records(t, tt.wantLog)
				if len(recs) == 0 || recs[0]["error"] != hookErr.Error() {
					t.Errorf("log records %q = %v, want one with error %q", tt.wantLog, recs, hookErr)
				}
			}
		})
	}
}

func TestHealth(t *testing.T) {
	tests := []struct {
		name       string
		hook       func(context.Context) Health
		wantStatus pluginv1.HealthResponse_Status
		wantReason string
	}{
		{"default", nil, pluginv1.HealthResponse_STATUS_READY, ""},
		{"hook ready", func(context.Context) Health { return Health{Status: StatusReady} }, pluginv1.HealthResponse_STATUS_READY, ""},
		{"hook degraded", func(context.Context) Health { return Health{Status: StatusDegraded, Reason: "cache cold"} },
			pluginv1.HealthResponse_STATUS_DEGRADED, "cache cold"},
		{"hook not ready", func(context.Context) Health { return Health{Status: StatusNotReady, Reason: "no upstream"} },
			pluginv1.HealthResponse_STATUS_NOT_READY, "no upstream"},
		{"hook panics", func(context.Context) Health { panic("health probe bug") },
			pluginv1.HealthResponse_STATUS_NOT_READY, "health hook panicked: health probe bug"},
		{"hook deadline visible", func(ctx context.Context) Health {
			if _, ok := ctx.Deadline(); !ok {
				return Health{Status: StatusNotReady, Reason: "no deadline"}
			}
			return Health{Status: StatusReady}
		}, pluginv1.HealthResponse_STATUS_READY, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pluginWith(okHandler())
			p.Health = tt.hook
			tp := startPlugin(t, p)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			resp, err := tp.client.Health(ctx, &pluginv1.HealthRequest{})
			if err != nil {
				t.Fatalf("Health() = %v", err)
			}
			if resp.GetStatus() != tt.wantStatus || resp.GetReason() != tt.wantReason {
				t.Errorf("Health() = %v %q, want %v %q", resp.GetStatus(), resp.GetReason(), tt.wantStatus, tt.wantReason)
			}
		})
	}
}

// badCollector reports a metric that cannot be gathered.
type badCollector struct{ desc *prometheus.Desc }

func (c badCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c badCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.NewInvalidMetric(c.desc, errors.New("backend down"))
}

func TestMetrics(t *testing.T) {
	p := pluginWith(okHandler())
	p.Configure = func(_ context.Context, rt *Runtime) error {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hello_greetings_total", Help: "Greetings sent."}, []string{"lang"})
		if err := rt.Registerer.Register(c); err != nil {
			return err
		}
		c.WithLabelValues("en").Add(3)
		return nil
	}
	tp := startPlugin(t, p)
	if resp, err := tp.client.Configure(t.Context(), &pluginv1.ConfigureRequest{}); err != nil || resp.GetError() != "" {
		t.Fatalf("Configure() = %v, %v", resp, err)
	}
	resp, err := tp.client.Metrics(t.Context(), &pluginv1.MetricsRequest{})
	if err != nil {
		t.Fatalf("Metrics() = %v", err)
	}
	if len(resp.GetFamilies()) != 1 {
		t.Fatalf("Metrics() has %d families, want 1", len(resp.GetFamilies()))
	}
	var mf dto.MetricFamily
	if err := proto.Unmarshal(resp.GetFamilies()[0], &mf); err != nil {
		t.Fatalf("proto.Unmarshal(family) = %v", err)
	}
	want := &dto.MetricFamily{
		Name: proto.String("hello_greetings_total"),
		Help: proto.String("Greetings sent."),
		Type: dto.MetricType_COUNTER.Enum(),
		Metric: []*dto.Metric{{
			Label:   []*dto.LabelPair{{Name: proto.String("lang"), Value: proto.String("en")}},
			Counter: &dto.Counter{Value: proto.Float64(3)},
		}},
	}
	ignore := protocmp.IgnoreFields(&dto.Counter{}, "created_timestamp")
	if diff := cmp.Diff(want, &mf, protocmp.Transform(), ignore); diff != "" {
		t.Errorf("Metrics() family mismatch (-want +got):\n%s", diff)
	}
}

func TestMetricsEmpty(t *testing.T) {
	tp := startPlugin(t, pluginWith(okHandler()))
	resp, err := tp.client.Metrics(t.Context(), &pluginv1.MetricsRequest{})
	if err != nil || len(resp.GetFamilies()) != 0 {
		t.Errorf("Metrics() before Configure = %v, %v, want no families", resp, err)
	}
}

func TestMetricsGatherError(t *testing.T) {
	p := pluginWith(okHandler())
	p.Configure = func(_ context.Context, rt *Runtime) error {
		return rt.Registerer.Register(badCollector{prometheus.NewDesc("hello_bad", "Broken.", nil, nil)})
	}
	tp := startPlugin(t, p)
	if resp, err := tp.client.Configure(t.Context(), &pluginv1.ConfigureRequest{}); err != nil || resp.GetError() != "" {
		t.Fatalf("Configure() = %v, %v", resp, err)
	}
	_, err := tp.client.Metrics(t.Context(), &pluginv1.MetricsRequest{})
	if got := status.Code(err); got != codes.Internal {
		t.Errorf("Metrics() with a failing collector = %v, want code %v", err, codes.Internal)
	}
}
