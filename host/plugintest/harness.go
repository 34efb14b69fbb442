package plugintest

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/plughost/plughost/host/config"
	"github.com/plughost/plughost/host/dataplane"
	"github.com/plughost/plughost/host/ingress"
	"github.com/plughost/plughost/host/metrics"
	"github.com/plughost/plughost/host/supervisor"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/wire"
)

// Options configure New.
type Options struct {
	// Config is the body of the plugin's config block in HCL, as an operator
	// would write it inside `config { ... }`. It is checked against the
	// plugin's declared schema and defaults are applied, as the host does.
	Config string
	// DataDir is the plugin's data directory; default t.TempDir().
	DataDir string
	// Instance is the plugin's instance name; default the plugin's Name.
	Instance string
	// Limits are handed to the plugin; defaults 1 MiB and 5s.
	Limits sdk.Limits
	// Plugins are other plugins, by instance name, that Runtime.Host.Call
	// reaches; requests arrive with paths relative to their mount.
	Plugins map[string]http.Handler
}

// Harness is a plugin served in-process. It is an http.Handler for the
// plugin's routes; paths are relative to the plugin's mount point.
type Harness struct {
	t        testing.TB
	rpc      *wire.Client
	manifest *pluginv1.DescribeResponse
	limits   sdk.Limits
	logs     *buffer
	ingress  *ingress.Ingress
}

// harnessConns is how many data-plane connections the harness gives the
// plugin: more than one, as the host does, so that requests in parallel
// travel on different connections.
const harnessConns = 2

// configureTimeout bounds the plugin's Configure hook in the harness.
const configureTimeout = 30 * time.Second

// harnessMount is where the harness mounts the plugin in its ingress.
const harnessMount = "/plugin"

// New serves def in-process and configures it with opts. It fails t when
// the definition is invalid or the plugin refuses its config; use Start to
// test refusals.
func New(t testing.TB, def sdk.Plugin, opts Options) *Harness {
	t.Helper()
	h, err := Start(t, def, opts)
	if err != nil {
		t.Fatalf("plugintest: %v", err)
	}
	return h
}

// Refused starts def with opts as Start does and fails t unless the config
// is refused: by the plugin's Configure with an *sdk.ConfigError whose
// Attribute is attribute, which it returns, or, when attribute is empty,
// by the host before Configure runs, for breaking the schema the plugin
// declared (labels included); it then returns nil.
func Refused(t testing.TB, def sdk.Plugin, opts Options, attribute string) *sdk.ConfigError {
	t.Helper()
	_, err := Start(t, def, opts)
	var ce *sdk.ConfigError
	switch {
	case err == nil:
		t.Fatalf("plugintest: Start(%s) succeeded, want it refused", opts.Config)
	case attribute == "" && errors.As(err, &ce):
		t.Fatalf("plugintest: Start(%s) = %v, want a schema error before Configure runs", opts.Config, err)
	case attribute != "" && (!errors.As(err, &ce) || ce.Attribute != attribute):
		t.Fatalf("plugintest: Start(%s) = %v, want a ConfigError on %s", opts.Config, err, attribute)
	}
	return ce
}

// Start is New returning the plugin's refusal of its config (an error
// wrapping an *sdk.ConfigError) or a schema violation (config diagnostics)
// instead of failing t.
func Start(t testing.TB, def sdk.Plugin, opts Options) (*Harness, error) {
	t.Helper()
	logs := &buffer{}
	logger := hclog.New(&hclog.LoggerOptions{Name: def.Name, Level: hclog.Debug, Output: logs})
	hostEnds, pluginEnds, err := dataPlane(harnessConns)
	if err != nil {
		return nil, err
	}
	cfg, err := wire.ServeInProcess(def, logger, pluginEnds)
	if err != nil {
		closeConns(hostEnds)
		closeConns(pluginEnds)
		return nil, fmt.Errorf("invalid plugin definition: %w", err)
	}
	data := dataplane.New(hostEnds)
	ctx, cancel := context.WithCancel(context.Background())
	reattach := make(chan *plugin.ReattachConfig, 1)
	closed := make(chan struct{})
	cfg.Test = &plugin.ServeTestConfig{Context: ctx, ReattachConfigCh: reattach, CloseCh: closed}
	go plugin.Serve(cfg)
	var rc *plugin.ReattachConfig
	select {
	case rc = <-reattach:
	case <-closed:
		cancel()
		data.Close()
		closeConns(pluginEnds)
		return nil, errors.New("plugin server stopped before it was ready")
	case <-time.After(10 * time.Second):
		cancel()
		data.Close()
		closeConns(pluginEnds)
		return nil, errors.New("plugin server did not start within 10s")
	}
	// go-plugin would watch the reattached "process" (this test binary)
	// for ever; this runner ends when the in-process server does.
	rc.ReattachFunc = func() (runner.AttachedRunner, error) {
		return &inProcess{closed: closed, stop: cancel}, nil
	}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig: wire.Handshake,
		// A reattached client does no version negotiation; it uses Plugins.
		Plugins:          wire.PluginSets(nil)[wire.ProtocolVersion],
		Reattach:         rc,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           logger.Named("client"),
		GRPCDialOptions: []grpc.DialOption{grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(wire.MaxMessageBytes),
			grpc.MaxCallSendMsgSize(wire.MaxMessageBytes))},
	})
	var conn plugin.ClientProtocol
	t.Cleanup(func() {
		// Stop the server first: closing the client would ask it to shut
		// down too, and go-plugin's two stop paths race. A reattached test
		// client has no process to kill, so Kill does not close the gRPC
		// connection; close it here.
		cancel()
		<-closed
		data.Close()
		if conn != nil {
			_ = conn.Close()
		}
		client.Kill()
		if t.Failed() && logs.Len() > 0 {
			t.Logf("plugin log:\n%s", logs.String())
		}
	})
	conn, err = client.Client()
	if err != nil {
		return nil, fmt.Errorf("connect to plugin: %w", err)
	}
	raw, err := conn.Dispense(wire.PluginKey)
	if err != nil {
		return nil, fmt.Errorf("dispense plugin: %w", err)
	}
	h := &Harness{t: t, rpc: raw.(*wire.Client), logs: logs}
	if h.manifest, err = h.rpc.Describe(ctx, &pluginv1.DescribeRequest{BlockLabels: true}); err != nil {
		return nil, fmt.Errorf("describe: %w", err)
	}

	js, err := decodeConfig(opts.Config, h.manifest.GetConfigSchema())
	if err != nil {
		return nil, err
	}
	var hostID uint32
	if len(opts.Plugins) > 0 {
		hostID = h.rpc.Broker.NextId()
		go h.rpc.Broker.AcceptAndServe(hostID, func(o []grpc.ServerOption) *grpc.Server {
			s := grpc.NewServer(o...)
			pluginv1.RegisterHostServer(s, &fakeHost{plugins: opts.Plugins})
			return s
		})
	}
	h.limits = opts.Limits
	if h.limits.MaxBodyBytes == 0 {
		h.limits.MaxBodyBytes = 1 << 20
	}
	if h.limits.RequestTimeout == 0 {
		h.limits.RequestTimeout = 5 * time.Second
	}
	if opts.DataDir == "" {
		opts.DataDir = t.TempDir()
	}
	if opts.Instance == "" {
		opts.Instance = def.Name
	}
	// As the host bounds it with start_timeout: a hook that hangs fails
	// the test instead of hanging it.
	cctx, ccancel := context.WithTimeout(ctx, configureTimeout)
	defer ccancel()
	resp, err := h.rpc.Configure(cctx, &pluginv1.ConfigureRequest{
		ConfigJson:   js,
		DataDir:      opts.DataDir,
		Limits:       &pluginv1.Limits{MaxBodyBytes: h.limits.MaxBodyBytes, RequestTimeoutMs: h.limits.RequestTimeout.Milliseconds()},
		HostBrokerId: hostID,
		Instance:     opts.Instance,
	})
	if err != nil {
		return nil, fmt.Errorf("configure: %w", err)
	}
	if msg := resp.GetError(); msg != "" {
		return nil, fmt.Errorf("plugin refused its config: %w", &sdk.ConfigError{Attribute: resp.GetAttribute(), Message: msg})
	}
	h.ingress = ingress.New(logger.Named("ingress"), metrics.New(), ingress.Limits{
		MaxBodyBytes:   h.limits.MaxBodyBytes,
		RequestTimeout: h.limits.RequestTimeout,
	})
	h.ingress.Update([]ingress.Target{&target{
		spec:     supervisor.Spec{Name: opts.Instance, Mount: harnessMount},
		conn:     supervisor.NewEndpoint(h.rpc, data),
		manifest: h.manifest,
	}})
	return h, nil
}

// dataPlane returns n connected socket pairs as data-plane connections:
// the host's ends and the plugin's.
func dataPlane(n int) (host, plugin []*wire.Conn, err error) {
	for range n {
		hc, pf, err := wire.SocketPair()
		if err != nil {
			closeConns(host)
			closeConns(plugin)
			return nil, nil, fmt.Errorf("data plane: %w", err)
		}
		pc, err := net.FileConn(pf)
		_ = pf.Close()
		if err != nil {
			_ = hc.Close()
			closeConns(host)
			closeConns(plugin)
			return nil, nil, fmt.Errorf("data plane: %w", err)
		}
		host = append(host, wire.NewConn(hc))
		plugin = append(plugin, wire.NewConn(pc))
	}
	return host, plugin, nil
}

func closeConns(cs []*wire.Conn) {
	for _, c := range cs {
		_ = c.Close()
	}
}

// target is the in-process plugin as the ingress sees it: always ready.
type target struct {
	spec     supervisor.Spec
	conn     *supervisor.Endpoint
	manifest *pluginv1.DescribeResponse
}

func (t *target) Name() string                         { return t.spec.Name }
func (t *target) Spec() supervisor.Spec                { return t.spec }
func (t *target) Endpoint() *supervisor.Endpoint       { return t.conn }
func (t *target) Manifest() *pluginv1.DescribeResponse { return t.manifest }
func (t *target) Status() supervisor.Status {
	return supervisor.Status{Name: t.spec.Name, State: supervisor.StateReady, Mount: t.spec.Mount}
}

// inProcess is the go-plugin runner of a plugin served in this process.
type inProcess struct {
	closed <-chan struct{}
	stop   context.CancelFunc
}

func (p *inProcess) Wait(ctx context.Context) error {
	select {
	case <-p.closed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *inProcess) Kill(context.Context) error { p.stop(); return nil }

func (p *inProcess) ID() string { return "in-process" }

func (p *inProcess) PluginToHost(network, addr string) (string, string, error) {
	return network, addr, nil
}

func (p *inProcess) HostToPlugin(network, addr string) (string, string, error) {
	return network, addr, nil
}

// decodeConfig parses an HCL config body and decodes it against schema as
// the host does. Diagnostics become one error naming line and column.
func decodeConfig(src string, schema *pluginv1.Schema) ([]byte, error) {
	f, diags := hclsyntax.ParseConfig([]byte(src), "config", hcl.InitialPos)
	if diags.HasErrors() {
		return nil, fmt.Errorf("config: %w", diags)
	}
	if err := config.CheckSchema(schema); err != nil {
		return nil, err
	}
	js, diags := config.DecodePluginConfig(f.Body, schema)
	if diags.HasErrors() {
		return nil, fmt.Errorf("config does not match the declared schema: %w", diags)
	}
	return js, nil
}

// ServeHTTP sends r to the plugin through the host's own ingress and data
// plane, as if the plugin were mounted at "/": only declared routes are
// forwarded (others get 404 or 405), the body is capped at the route's
// own limit (sdk.MaxBody) or else Limits.MaxBodyBytes (413), ordinary
// routes get the route's timeout or Limits.RequestTimeout, streaming
// routes are relayed as the plugin flushes, and errors have the host's
// JSON shape.
// A response the host cuts short (the plugin failed after its head was
// sent, as a real client would see by a connection closed mid-body) leaves
// in w what was written before the cut.
func (h *Harness) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r2 := new(http.Request)
	*r2 = *r
	u := *r.URL
	u.Path = harnessMount + u.Path
	if u.RawPath != "" {
		u.RawPath = harnessMount + u.RawPath
	}
	r2.URL = &u
	if r2.RemoteAddr == "" {
		r2.RemoteAddr = "plugintest"
	}
	defer func() {
		// The ingress cuts a response short with this panic, which
		// net/http's server absorbs and a test's recorder does not.
		if v := recover(); v != nil && v != http.ErrAbortHandler {
			panic(v)
		}
	}()
	h.ingress.ServeHTTP(w, r2)
}

// Drain asks the plugin to drain until deadline and reports how many
// in-flight requests completed and how many were abandoned.
func (h *Harness) Drain(ctx context.Context, deadline time.Time) (completed, abandoned int64, err error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	resp, err := h.rpc.Drain(ctx, &pluginv1.DrainRequest{DeadlineUnixNano: deadline.UnixNano()})
	if err != nil {
		return 0, 0, fmt.Errorf("drain: %w", err)
	}
	return resp.GetCompleted(), resp.GetAbandoned(), nil
}

// Health returns the plugin's answer to a health check.
func (h *Harness) Health(ctx context.Context) (sdk.Health, error) {
	resp, err := h.rpc.Health(ctx, &pluginv1.HealthRequest{})
	if err != nil {
		return sdk.Health{}, fmt.Errorf("health: %w", err)
	}
	st := sdk.StatusReady
	switch resp.GetStatus() {
	case pluginv1.HealthResponse_STATUS_DEGRADED:
		st = sdk.StatusDegraded
	case pluginv1.HealthResponse_STATUS_NOT_READY:
		st = sdk.StatusNotReady
	}
	return sdk.Health{Status: st, Reason: resp.GetReason()}, nil
}

// Metrics returns the plugin's metrics in the Prometheus text format, as
// the plugin reports them (the host adds a plugin label).
func (h *Harness) Metrics(ctx context.Context) (string, error) {
	resp, err := h.rpc.Metrics(ctx, &pluginv1.MetricsRequest{})
	if err != nil {
		return "", fmt.Errorf("metrics: %w", err)
	}
	var b strings.Builder
	for _, raw := range resp.GetFamilies() {
		mf := &dto.MetricFamily{}
		if err := proto.Unmarshal(raw, mf); err != nil {
			return "", fmt.Errorf("decode metric family: %w", err)
		}
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			return "", fmt.Errorf("encode metric family %q: %w", mf.GetName(), err)
		}
	}
	return b.String(), nil
}

// Logs returns what the plugin has logged so far.
func (h *Harness) Logs() string { return h.logs.String() }

// fakeHost serves Host.Call from the handlers in Options.Plugins. It is a
// stand-in for the host's ingress: no limits or readiness rules apply.
type fakeHost struct {
	pluginv1.UnimplementedHostServer
	plugins map[string]http.Handler
}

func (f *fakeHost) Call(ctx context.Context, req *pluginv1.CallRequest) (*pluginv1.HTTPResponse, error) {
	target, ok := f.plugins[req.GetPlugin()]
	if !ok {
		// What the host's ingress answers too.
		return nil, status.Errorf(codes.NotFound, "no plugin named %q", req.GetPlugin())
	}
	pr := req.GetRequest()
	r, err := http.NewRequestWithContext(ctx, pr.GetMethod(), pr.GetPath(), bytes.NewReader(pr.GetBody()))
	if err != nil {
		return nil, err
	}
	r.URL.RawQuery = pr.GetRawQuery()
	wire.HeadersFromProto(r.Header, pr.GetHeaders())
	rec := &recorder{header: http.Header{}, code: http.StatusOK}
	target.ServeHTTP(rec, r)
	return &pluginv1.HTTPResponse{Status: int32(rec.code), Headers: wire.HeadersToProto(rec.header), Body: rec.body.Bytes()}, nil
}

type recorder struct {
	header http.Header
	code   int
	wrote  bool
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(code int) {
	if !r.wrote {
		r.code, r.wrote = code, true
	}
}
func (r *recorder) Write(b []byte) (int, error) { r.WriteHeader(http.StatusOK); return r.body.Write(b) }

// buffer is a goroutine-safe log sink.
type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func (b *buffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Len()
}
