package sdk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/internal/dataplane"
	"github.com/plughost/plughost/sdk/route"
	"github.com/plughost/plughost/sdk/wire"
)

// server adapts a Plugin to the contract: the gRPC control plane, and the
// handler that serves the data plane's requests.
type server struct {
	pluginv1.UnimplementedPluginServer

	p        Plugin
	logger   hclog.Logger
	registry *prometheus.Registry
	broker   *plugin.GRPCBroker
	inflight inflight

	// ctx is the Runtime's lifetime context, cancelled on Drain.
	ctx    context.Context
	cancel context.CancelFunc
	faults Faults
	// closeOnce runs the Close hook at the end of the first drain.
	closeOnce sync.Once

	// dataWG waits for the goroutines serving data-plane connections.
	dataWG sync.WaitGroup

	mu         sync.Mutex
	configured bool
}

func newServer(p Plugin, logger hclog.Logger, broker *plugin.GRPCBroker) *server {
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{
		p:        p,
		logger:   logger,
		registry: prometheus.NewRegistry(),
		broker:   broker,
		ctx:      ctx,
		cancel:   cancel,
	}
	s.inflight.init()
	return s
}

func (s *server) Describe(_ context.Context, req *pluginv1.DescribeRequest) (*pluginv1.DescribeResponse, error) {
	schema, err := s.p.Config.toProto()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if !req.GetBlockLabels() && s.p.Config.hasLabels() {
		// A host built before labels would drop them: it would refuse
		// the operator's labelled blocks, or pass objects without them.
		return nil, status.Errorf(codes.FailedPrecondition,
			"plugin %q declares labelled config blocks, which this host does not decode; run it under a plughost release that decodes block labels",
			s.p.Name)
	}
	resp := &pluginv1.DescribeResponse{
		Name:           s.p.Name,
		Version:        s.p.Version,
		ConfigSchema:   schema,
		SdkVersion:     Version,
		Routes:         wire.RoutesToProto(s.p.Routes.Routes()),
		SingleInstance: s.p.SingleInstance,
	}
	return resp, nil
}

func (s *server) Configure(ctx context.Context, req *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	s.mu.Lock()
	if s.configured {
		s.mu.Unlock()
		return nil, status.Error(codes.FailedPrecondition, "plugin is already configured; the host restarts a plugin to change its config")
	}
	s.configured = true
	s.mu.Unlock()

	cfg := req.GetConfigJson()
	if len(cfg) == 0 {
		cfg = []byte("{}")
	}
	rt := &Runtime{
		Instance:   req.GetInstance(),
		Logger:     s.logger,
		Registerer: s.registry,
		DataDir:    req.GetDataDir(),
		Limits: Limits{
			MaxBodyBytes:   req.GetLimits().GetMaxBodyBytes(),
			RequestTimeout: time.Duration(req.GetLimits().GetRequestTimeoutMs()) * time.Millisecond,
		},
		Host:   &hostClient{broker: s.broker, id: req.GetHostBrokerId()},
		config: cfg,
		ctx:    s.ctx,
		faults: &s.faults,
	}
	if s.p.Configure != nil {
		if err := s.hook("configure", func() error { return s.p.Configure(ctx, rt) }); err != nil {
			if errors.Is(err, ErrStorageCorrupt) {
				return &pluginv1.ConfigureResponse{Error: err.Error(), StorageCorrupt: true}, nil
			}
			var ce *ConfigError
			if errors.As(err, &ce) {
				return &pluginv1.ConfigureResponse{Error: ce.message(), Attribute: ce.Attribute}, nil
			}
			return &pluginv1.ConfigureResponse{Error: err.Error()}, nil
		}
	}
	return &pluginv1.ConfigureResponse{}, nil
}

// hook runs one of the plugin's hooks, turning a panic into an error that
// is logged with its stack, so a bad hook does not take the process down.
func (s *server) hook(name string, fn func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			s.logger.Error("hook panicked", "hook", name, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			err = fmt.Errorf("%s hook panicked: %v", name, v)
		}
	}()
	return fn()
}

func (s *server) SetFaults(_ context.Context, req *pluginv1.SetFaultsRequest) (*pluginv1.SetFaultsResponse, error) {
	list := make([]Fault, 0, len(req.GetFaults()))
	for _, f := range req.GetFaults() {
		if f.GetPoint() == "" || f.GetDelayMs() < 0 {
			return nil, status.Error(codes.InvalidArgument, "a fault needs a point and a non-negative delay")
		}
		list = append(list, Fault{Point: f.GetPoint(), Delay: time.Duration(f.GetDelayMs()) * time.Millisecond, Error: f.GetError()})
	}
	if err := s.faults.Set(list); err != nil {
		// NotFound, with the point and the declared points, which the
		// host answers as 400 unknown_fault_point.
		return nil, status.Error(codes.NotFound, strings.TrimPrefix(err.Error(), ErrUnknownPoint.Error()+" "))
	}
	s.logger.Warn("faults set", "faults", fmt.Sprint(list))
	resp := &pluginv1.SetFaultsResponse{}
	for _, f := range s.faults.List() {
		resp.Faults = append(resp.Faults, &pluginv1.FaultSpec{Point: f.Point, DelayMs: f.Delay.Milliseconds(), Error: f.Error})
	}
	return resp, nil
}

func (s *server) Health(ctx context.Context, _ *pluginv1.HealthRequest) (*pluginv1.HealthResponse, error) {
	h := Health{Status: StatusReady}
	switch {
	case s.inflight.isDraining():
		h = Health{Status: StatusNotReady, Reason: "draining"}
	case s.p.Health != nil:
		if err := s.hook("health", func() error { h = s.p.Health(ctx); return nil }); err != nil {
			h = Health{Status: StatusNotReady, Reason: err.Error()}
		}
	}
	st := pluginv1.HealthResponse_STATUS_READY
	switch h.Status {
	case StatusDegraded:
		st = pluginv1.HealthResponse_STATUS_DEGRADED
	case StatusNotReady:
		st = pluginv1.HealthResponse_STATUS_NOT_READY
	}
	return &pluginv1.HealthResponse{Status: st, Reason: h.Reason}, nil
}

func (s *server) Metrics(context.Context, *pluginv1.MetricsRequest) (*pluginv1.MetricsResponse, error) {
	mfs, err := s.registry.Gather()
	if err != nil {
		// Gather returns what it could alongside the error; the host
		// reports the error, so send nothing rather than half a set.
		return nil, status.Errorf(codes.Internal, "gather metrics: %v", err)
	}
	resp := &pluginv1.MetricsResponse{Families: make([][]byte, 0, len(mfs))}
	for _, mf := range mfs {
		b, err := proto.Marshal(mf)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "encode metric family %q: %v", mf.GetName(), err)
		}
		resp.Families = append(resp.Families, b)
	}
	return resp, nil
}

func (s *server) Drain(ctx context.Context, req *pluginv1.DrainRequest) (*pluginv1.DrainResponse, error) {
	if d := req.GetDeadlineUnixNano(); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, time.Unix(0, d))
		defer cancel()
	}
	started := s.inflight.drain()
	s.cancel()
	s.logger.Info("draining", "in_flight", started)
	if s.p.Drain != nil {
		if err := s.hook("drain", func() error { return s.p.Drain(ctx) }); err != nil {
			s.logger.Warn("drain hook failed", "error", err)
		}
	}
	left := s.inflight.wait(ctx)
	if s.p.Close != nil {
		s.closeOnce.Do(func() {
			if err := s.hook("close", func() error { return s.p.Close(ctx) }); err != nil {
				s.logger.Warn("close hook failed", "error", err)
			}
		})
	}
	return &pluginv1.DrainResponse{Completed: max(started-left, 0), Abandoned: left}, nil
}

// Refuse answers the host, in place of any answer, that the request was
// not handled, so that it sends the request to the process that replaces
// this one: for a handler that finds, before it has changed anything,
// that the plugin has begun to drain (a durable committer's ErrDraining
// from Submit). Nothing may have been written to w. It reports false when
// w cannot refuse (a Host.Call's or a test's writer); the handler then
// answers itself.
func Refuse(w http.ResponseWriter) bool {
	if rf, ok := w.(dataplane.Refuser); ok {
		rf.Refuse()
		return true
	}
	return false
}

// ServeHTTP runs the plugin's handler for one request from the data plane,
// counted in flight. Once a drain has begun it refuses the request
// (dataplane.Refuser), so that the host can send it to the instance that
// replaces this one, or answers 503 where it cannot refuse.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.inflight.acquire() {
		if Refuse(w) {
			return
		}
		WriteError(w, http.StatusServiceUnavailable, "draining", "plugin is draining; retry on another instance or later")
		return
	}
	defer s.inflight.release()
	s.p.Routes.ServeHTTP(w, r)
}

// serveData serves each data-plane connection in conns until the host
// closes it or it breaks, in goroutines that s.dataWG waits for. The
// process exits without waiting for them: a connection ends when the host
// is gone.
func (s *server) serveData(conns []*wire.Conn) {
	opts := dataplane.Options{Handler: s, Error: WriteError, Logger: s.logger, Inline: inlineRoutes(s.p.Routes.Routes())}
	for _, c := range conns {
		s.dataWG.Go(func() {
			defer c.Close()
			if err := dataplane.Serve(context.Background(), c, opts); err != nil {
				s.logger.Error("data plane connection broke", "error", err)
			}
		})
	}
}

// inlineRoutes returns what dataplane.Options.Inline asks of the routes
// rs: whether the route the host matched, by its pattern as the host's
// table gives it (route.Route.String), is marked sdk.Inline. Nil when
// none is.
func inlineRoutes(rs []route.Route) func(pattern string) bool {
	inline := map[string]bool{}
	for _, r := range rs {
		if r.Inline {
			inline[r.String()] = true
		}
	}
	if len(inline) == 0 {
		return nil
	}
	return func(pattern string) bool { return inline[pattern] }
}

// inflight counts requests being served and refuses new ones once a drain
// has begun.
type inflight struct {
	mu       sync.Mutex
	n        int64
	draining bool
	idle     chan struct{} // closed when draining and n reaches 0
}

func (f *inflight) init() { f.idle = make(chan struct{}) }

func (f *inflight) acquire() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.draining {
		return false
	}
	f.n++
	return true
}

func (f *inflight) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	if f.draining && f.n == 0 {
		close(f.idle)
	}
}

func (f *inflight) isDraining() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.draining
}

// drain refuses new work and returns how many requests are in flight.
func (f *inflight) drain() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.draining {
		f.draining = true
		if f.n == 0 {
			close(f.idle)
		}
	}
	return f.n
}

// wait blocks until nothing is in flight or ctx is done, and returns how
// many requests were still in flight.
func (f *inflight) wait(ctx context.Context) int64 {
	select {
	case <-f.idle:
	case <-ctx.Done():
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// hostClient calls the Host service over the go-plugin broker. It dials on
// first use, because most plugins never call the host.
type hostClient struct {
	broker *plugin.GRPCBroker
	id     uint32

	once   sync.Once
	client pluginv1.HostClient
	err    error
}

func (h *hostClient) Call(ctx context.Context, target string, req *http.Request) (*http.Response, error) {
	h.once.Do(func() {
		if h.broker == nil || h.id == 0 {
			h.err = errors.New("host service is not available")
			return
		}
		conn, err := h.broker.Dial(h.id)
		if err != nil {
			h.err = fmt.Errorf("dial host service: %w", err)
			return
		}
		h.client = pluginv1.NewHostClient(conn)
	})
	if h.err != nil {
		return nil, h.err
	}
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, fmt.Errorf("read request body: %w", err)
		}
		body = b
	}
	resp, err := h.client.Call(ctx, &pluginv1.CallRequest{
		Plugin: target,
		Request: &pluginv1.HTTPRequest{
			Method:   req.Method,
			Path:     req.URL.Path,
			RawQuery: req.URL.RawQuery,
			Headers:  wire.HeadersToProto(req.Header),
			Body:     body,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("call plugin %q: %w", target, err)
	}
	out := &http.Response{
		Status:        fmt.Sprintf("%d %s", resp.GetStatus(), http.StatusText(int(resp.GetStatus()))),
		StatusCode:    int(resp.GetStatus()),
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        http.Header{},
		Body:          io.NopCloser(bytes.NewReader(resp.GetBody())),
		ContentLength: int64(len(resp.GetBody())),
		Request:       req,
	}
	wire.HeadersFromProto(out.Header, resp.GetHeaders())
	return out, nil
}
