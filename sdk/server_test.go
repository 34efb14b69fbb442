package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/plughost/plughost/host/dataplane"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/internal/wiretest"
	"github.com/plughost/plughost/sdk/wire"
)

// syncBuffer is the plugin logger's sink, read as JSON records.
type syncBuffer struct{ wiretest.SyncBuffer }

// records returns the JSON log records with the given message.
func (b *syncBuffer) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(b.String()) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		if rec["@message"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// testPlugin is a plugin served by the SDK: its gRPC control plane on a
// loopback listener with a client connected to it, and its data plane
// over socket pairs with the host's Transport on the other ends.
type testPlugin struct {
	client pluginv1.PluginClient
	srv    *server
	// data carries requests to the plugin, as the host's does.
	data  dataplane.Transport
	logs  *syncBuffer
	calls sync.WaitGroup
}

// testDataConns is how many data-plane connections startPlugin makes.
const testDataConns = 2

// startPlugin serves p on 127.0.0.1 with a real gRPC server and on
// data-plane socket pairs. Cleanup closes the client and the data plane,
// stops the server and waits for every call started with goCall or
// goHandle.
func startPlugin(t *testing.T, p Plugin) *testPlugin {
	t.Helper()
	tp := &testPlugin{logs: &syncBuffer{}}
	logger := hclog.New(&hclog.LoggerOptions{
		Name:       "test",
		Level:      hclog.Trace,
		Output:     tp.logs,
		JSONFormat: true,
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("net.Listen(tcp, 127.0.0.1:0) = %v", err)
	}
	gs := grpc.NewServer(grpc.WaitForHandlers(true))
	srv := newServer(p, logger, nil)
	tp.srv = srv
	var hostEnds, pluginEnds []*wire.Conn
	for range testDataConns {
		h, pe := wiretest.SocketPair(t)
		hostEnds = append(hostEnds, wire.NewConn(h))
		pluginEnds = append(pluginEnds, wire.NewConn(pe))
	}
	srv.serveData(pluginEnds)
	tp.data = dataplane.New(hostEnds)
	pluginv1.RegisterPluginServer(gs, srv)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tp.data.Close()
		srv.dataWG.Wait()
		gs.Stop()
		<-served
		t.Fatalf("grpc.NewClient(%s) = %v", lis.Addr(), err)
	}
	tp.client = pluginv1.NewPluginClient(conn)
	t.Cleanup(func() {
		// Closing the data plane fails the requests still waiting and
		// cancels their handlers' contexts, so handlers that honour
		// r.Context() return; the plugin's side ends with it.
		tp.data.Close()
		srv.dataWG.Wait()
		if err := conn.Close(); err != nil {
			t.Errorf("conn.Close() = %v", err)
		}
		tp.calls.Wait()
		gs.Stop()
		// Serve returns ErrServerStopped when Stop ran before the
		// goroutine reached Serve, which a test that never calls the
		// control plane can do.
		if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("grpc Serve() = %v, want nil or ErrServerStopped after Stop", err)
		}
	})
	return tp
}

// reply is a whole response from the data plane.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// handle sends req over the data plane, as the host does, and reads the
// whole response.
func (tp *testPlugin) handle(ctx context.Context, req *dataplane.Request) (*reply, error) {
	resp, err := tp.data.RoundTrip(ctx, req)
	if err != nil {
		return nil, err
	}
	defer resp.Close()
	r := &reply{status: resp.Status, header: resp.Header}
	for {
		b, err := resp.Next()
		if err == io.EOF {
			return r, nil
		}
		if err != nil {
			return r, err
		}
		r.body = append(r.body, b...)
	}
}

// handleStream sends req over the data plane and returns the response's
// head and its body's pieces as Next returns them, with the error that
// ended them (nil at io.EOF).
func (tp *testPlugin) handleStream(ctx context.Context, req *dataplane.Request) (*dataplane.Response, [][]byte, error) {
	resp, err := tp.data.RoundTrip(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Close()
	pieces, err := readPieces(resp)
	return resp, pieces, err
}

// readPieces reads the rest of resp's body, piece by piece, and returns
// the error that ended it (nil at io.EOF).
func readPieces(resp *dataplane.Response) ([][]byte, error) {
	var pieces [][]byte
	for {
		b, err := resp.Next()
		if err == io.EOF {
			return pieces, nil
		}
		if err != nil {
			return pieces, err
		}
		pieces = append(pieces, b)
	}
}

// call is a request running in its own goroutine.
type call struct {
	done chan struct{}
	resp *reply
	err  error
}

// goCall runs fn in a goroutine that the plugin's cleanup waits for. fn
// must return once the data plane or the client connection is closed.
func (tp *testPlugin) goCall(fn func()) {
	tp.calls.Go(fn)
}

// goHandle starts a request.
func (tp *testPlugin) goHandle(ctx context.Context, req *dataplane.Request) *call {
	c := &call{done: make(chan struct{})}
	tp.goCall(func() {
		defer close(c.done)
		c.resp, c.err = tp.handle(ctx, req)
	})
	return c
}

// wait returns the call's result, failing the test if it takes over 10s.
func (c *call) wait(t *testing.T) (*reply, error) {
	t.Helper()
	select {
	case <-c.done:
		return c.resp, c.err
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not return within 10s")
		return nil, nil
	}
}

// waitFor fails the test unless ch is closed or receives within 10s.
func waitFor[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out after 10s waiting for %s", what)
		var zero T
		return zero
	}
}

// errorBody is the platform's JSON error shape.
type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func decodeError(t *testing.T, body []byte) errorBody {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %q is not JSON: %v", body, err)
	}
	return e
}

func okHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
}

// pluginWith returns a plugin that serves every path with h.
func pluginWith(h http.Handler) Plugin {
	return Plugin{
		Name:    "test",
		Version: "1.2.3",
		Routes:  muxWith(func(m *Mux) { m.Handle("/", h) }),
	}
}

func TestDescribe(t *testing.T) {
	p := Plugin{
		Name:           "hello",
		Version:        "0.3.0",
		SingleInstance: true,
		Routes: muxWith(func(m *Mux) {
			m.Handle("GET /{$}", http.NotFoundHandler())
			m.Handle("POST /items/{id}", http.NotFoundHandler(), Timeout(1500*time.Millisecond))
			m.Handle("/events", http.NotFoundHandler(), Streaming())
			m.Handle("PUT /blobs/{id}", http.NotFoundHandler(), MaxBody(8<<20))
			m.Handle("POST /reset", http.NotFoundHandler(), NoBody())
		}),
		Config: Schema{
			Attrs: []Attr{
				{Name: "greeting", Type: TypeString, Default: "hello", Description: "what to say"},
				{Name: "port", Type: TypeNumber, Required: true},
				{Name: "verbose", Type: TypeBool, Default: false},
				{Name: "timeout", Type: TypeDuration, Default: "5s"},
				{Name: "names", Type: ListOf(TypeString), Default: []string{"ada", "grace"}},
				{Name: "weights", Type: MapOf(TypeNumber), Default: map[string]float64{"a": 0.5}},
				{Name: "optional", Type: TypeString},
			},
			Blocks: []Block{
				{Name: "upstream", List: true, Description: "backends", Schema: Schema{
					Attrs: []Attr{{Name: "url", Type: TypeString, Required: true}},
				}},
				{Name: "tls", Required: true, Schema: Schema{
					Attrs:  []Attr{{Name: "cert_file", Type: TypeString}},
					Blocks: []Block{{Name: "client_auth", Schema: Schema{}}},
				}},
			},
		},
	}
	tp := startPlugin(t, p)
	got, err := tp.client.Describe(t.Context(), &pluginv1.DescribeRequest{})
	if err != nil {
		t.Fatalf("Describe() = %v", err)
	}
	want := &pluginv1.DescribeResponse{
		Name:           "hello",
		Version:        "0.3.0",
		SdkVersion:     Version,
		SingleInstance: true,
		Routes: []*pluginv1.Route{
			{Method: "GET", Pattern: "/{$}"},
			{Method: "POST", Pattern: "/items/{id}", TimeoutMs: 1500},
			{Pattern: "/events", Streaming: true},
			{Method: "PUT", Pattern: "/blobs/{id}", MaxBodyBytes: 8 << 20},
			{Method: "POST", Pattern: "/reset", NoBody: true},
		},
		ConfigSchema: &pluginv1.Schema{
			Attributes: []*pluginv1.Attribute{
				{Name: "greeting", Type: "string", DefaultJson: `"hello"`, Description: "what to say"},
				{Name: "port", Type: "number", Required: true},
				{Name: "verbose", Type: "bool", DefaultJson: "false"},
				{Name: "timeout", Type: "duration", DefaultJson: `"5s"`},
				{Name: "names", Type: "list(string)", DefaultJson: `["ada","grace"]`},
				{Name: "weights", Type: "map(number)", DefaultJson: `{"a":0.5}`},
				{Name: "optional", Type: "string"},
			},
			Blocks: []*pluginv1.Block{
				{Name: "upstream", Nesting: pluginv1.Block_NESTING_LIST, Description: "backends", Body: &pluginv1.Schema{
					Attributes: []*pluginv1.Attribute{{Name: "url", Type: "string", Required: true}},
				}},
				{Name: "tls", Nesting: pluginv1.Block_NESTING_SINGLE, Required: true, Body: &pluginv1.Schema{
					Attributes: []*pluginv1.Attribute{{Name: "cert_file", Type: "string"}},
					Blocks:     []*pluginv1.Block{{Name: "client_auth", Nesting: pluginv1.Block_NESTING_SINGLE, Body: &pluginv1.Schema{}}},
				}},
			},
		},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("Describe() mismatch (-want +got):\n%s", diff)
	}
}

// TestDescribeLabels: a plugin that declares labelled blocks describes
// itself only to a host that says it decodes them; a host that does not
// would drop the labels.
func TestDescribeLabels(t *testing.T) {
	labelled := Schema{Blocks: []Block{{Name: "limits", Schema: Schema{Blocks: []Block{
		{Name: "tenant", Labels: []string{"name"}, List: true, Schema: Schema{Attrs: []Attr{{Name: "rate", Type: TypeNumber}}}},
	}}}}}
	tests := []struct {
		name     string
		schema   Schema
		req      *pluginv1.DescribeRequest
		wantCode codes.Code
	}{
		{"labels, host decodes them", labelled, &pluginv1.DescribeRequest{BlockLabels: true}, codes.OK},
		{"labels, host from before them", labelled, &pluginv1.DescribeRequest{}, codes.FailedPrecondition},
		{"no labels, host from before them", Schema{Blocks: []Block{{Name: "tls"}}}, &pluginv1.DescribeRequest{}, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pluginWith(okHandler())
			p.Config = tt.schema
			tp := startPlugin(t, p)
			got, err := tp.client.Describe(t.Context(), tt.req)
			if code := status.Code(err); code != tt.wantCode {
				t.Fatalf("Describe(%v) = %v, want code %v", tt.req, err, tt.wantCode)
			}
			if err != nil {
				if msg := status.Convert(err).Message(); !strings.Contains(msg, "labelled config blocks") {
					t.Errorf("Describe(%v) message = %q, want it to say the plugin declares labelled config blocks", tt.req, msg)
				}
				return
			}
			if l := got.GetConfigSchema().GetBlocks()[0].GetBody().GetBlocks(); tt.req.GetBlockLabels() && !slices.Equal(l[0].GetLabels(), []string{"name"}) {
				t.Errorf("Describe() labels = %q, want [name]", l[0].GetLabels())
			}
		})
	}
}

func TestDescribeBadSchema(t *testing.T) {
	p := pluginWith(okHandler())
	p.Config = Schema{Attrs: []Attr{{Name: "a", Type: "integer"}}}
	tp := startPlugin(t, p)
	_, err := tp.client.Describe(t.Context(), &pluginv1.DescribeRequest{})
	if got := status.Code(err); got != codes.Internal {
		t.Errorf("Describe() with a bad schema = %v, want code %v", err, codes.Internal)
	}
}

func TestConfigure(t *testing.T) {
	type config struct {
		Greeting string   `json:"greeting"`
		Timeout  Duration `json:"timeout"`
	}
	// decode returns an error unless the config decodes to want.
	decode := func(want config) func(context.Context, *Runtime) error {
		return func(_ context.Context, rt *Runtime) error {
			var got config
			if err := rt.DecodeConfig(&got); err != nil {
				return err
			}
			if got != want {
				return fmt.Errorf("decoded %+v, want %+v", got, want)
			}
			return nil
		}
	}
	errRejected := errors.New("must not be empty")
	tests := []struct {
		name      string
		hook      func(context.Context, *Runtime) error
		config    string
		wantError string // substring of ConfigureResponse.error; empty means accepted
		wantAttr  string
		// wantCorrupt is ConfigureResponse.storage_corrupt: the hook's
		// error wraps ErrStorageCorrupt.
		wantCorrupt bool
	}{
		{
			name:   "config reaches DecodeConfig",
			hook:   decode(config{Greeting: "hi", Timeout: Duration(2 * time.Second)}),
			config: `{"greeting":"hi","timeout":"2s"}`,
		},
		{
			name:   "null duration",
			hook:   decode(config{Greeting: "hi"}),
			config: `{"greeting":"hi","timeout":null}`,
		},
		{
			name:      "unknown field",
			hook:      decode(config{}),
			config:    `{"greeting":"hi","colour":"red"}`,
			wantError: `decode config: json: unknown field "colour"`,
		},
		{
			name: "empty config is an empty object",
			hook: func(_ context.Context, rt *Runtime) error {
				if got := string(rt.RawConfig()); got != "{}" {
					return fmt.Errorf("RawConfig() = %q, want %q", got, "{}")
				}
				return nil
			},
		},
		{
			name:      "hook error",
			hook:      func(context.Context, *Runtime) error { return errors.New("database unreachable") },
			config:    `{}`,
			wantError: "database unreachable",
		},
		{
			name: "attribute error",
			hook: func(context.Context, *Runtime) error {
				return &ConfigError{Attribute: "greeting", Message: errRejected.Error()}
			},
			config:    `{}`,
			wantError: "must not be empty",
			wantAttr:  "greeting",
		},
		{
			name: "wrapped attribute error",
			hook: func(context.Context, *Runtime) error {
				return fmt.Errorf("check greeting: %w", &ConfigError{Attribute: "greeting", Message: errRejected.Error()})
			},
			config:    `{}`,
			wantError: "must not be empty",
			wantAttr:  "greeting",
		},
		{
			name: "storage corrupt",
			hook: func(context.Context, *Runtime) error {
				return fmt.Errorf("open ledger: %w: wallet.db.wal.1 record 17 at offset 20: checksum mismatch", ErrStorageCorrupt)
			},
			config:      `{}`,
			wantError:   "open ledger: storage corrupt: wallet.db.wal.1 record 17 at offset 20: checksum mismatch",
			wantCorrupt: true,
		},
		{
			name:   "no hook",
			config: `{"anything":1}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pluginWith(okHandler())
			p.Configure = tt.hook
			tp := startPlugin(t, p)
			resp, err := tp.client.Configure(t.Context(), &pluginv1.ConfigureRequest{ConfigJson: []byte(tt.config)})
			if err != nil {
				t.Fatalf("Configure(%q) = %v, want no gRPC error", tt.config, err)
			}
			if tt.wantError == "" && resp.GetError() != "" {
				t.Errorf("Configure(%q).error = %q, want none", tt.config, resp.GetError())
			}
			if tt.wantError != "" && !strings.Contains(resp.GetError(), tt.wantError) {
				t.Errorf("Configure(%q).error = %q, want it to contain %q", tt.config, resp.GetError(), tt.wantError)
			}
			if resp.GetAttribute() != tt.wantAttr {
				t.Errorf("Configure(%q).attribute = %q, want %q", tt.config, resp.GetAttribute(), tt.wantAttr)
			}
			if resp.GetStorageCorrupt() != tt.wantCorrupt {
				t.Errorf("Configure(%q).storage_corrupt = %v, want %v", tt.config, resp.GetStorageCorrupt(), tt.wantCorrupt)
			}
		})
	}
}

func TestConfigureRuntime(t *testing.T) {
	rts := make(chan *Runtime, 1)
	p := pluginWith(okHandler())
	p.Configure = func(_ context.Context, rt *Runtime) error {
		rts <- rt
		return nil
	}
	tp := startPlugin(t, p)
	req := &pluginv1.ConfigureRequest{
		ConfigJson:   []byte(`{}`),
		DataDir:      "/var/lib/plughost/hello-eu",
		Instance:     "hello-eu",
		Limits:       &pluginv1.Limits{MaxBodyBytes: 1 << 20, RequestTimeoutMs: 2500},
		HostBrokerId: 0,
	}
	if resp, err := tp.client.Configure(t.Context(), req); err != nil || resp.GetError() != "" {
		t.Fatalf("Configure() = %v, %v, want no error", resp, err)
	}
	rt := waitFor(t, rts, "the Configure hook")

	if rt.Instance != req.Instance {
		t.Errorf("Runtime.Instance = %q, want %q", rt.Instance, req.Instance)
	}
	if rt.DataDir != req.DataDir {
		t.Errorf("Runtime.DataDir = %q, want %q", rt.DataDir, req.DataDir)
	}
	if want := (Limits{MaxBodyBytes: 1 << 20, RequestTimeout: 2500 * time.Millisecond}); rt.Limits != want {
		t.Errorf("Runtime.Limits = %+v, want %+v", rt.Limits, want)
	}
	if rt.Logger == nil || rt.Registerer == nil || rt.Host == nil {
		t.Errorf("Runtime = %+v, want Logger, Registerer and Host set", rt)
	}
	// Without a host broker there is no Host service to call.
	hreq, _ := http.NewRequestWithContext(t.Context(), "GET", "/", nil)
	if _, err := rt.Host.Call(t.Context(), "other", hreq); err == nil || !strings.Contains(err.Error(), "not available") {
		t.Errorf("Runtime.Host.Call() without a broker = %v, want error containing %q", err, "not available")
	}

	if err := rt.Context().Err(); err != nil {
		t.Fatalf("Runtime.Context().Err() before Drain = %v, want nil", err)
	}
	_, err := tp.client.Configure(t.Context(), req)
	if got := status.Code(err); got != codes.FailedPrecondition {
		t.Errorf("second Configure() = %v, want code %v", err, codes.FailedPrecondition)
	}
	if _, err := tp.client.Drain(t.Context(), &pluginv1.DrainRequest{}); err != nil {
		t.Fatalf("Drain() = %v", err)
	}
	waitFor(t, rt.Context().Done(), "Runtime.Context() to be cancelled by Drain")
	if err := rt.Context().Err(); !errors.Is(err, context.Canceled) {
		t.Errorf("Runtime.Context().Err() after Drain = %v, want %v", err, context.Canceled)
	}
}

func TestConfigureRejectedIsFinal(t *testing.T) {
	p := pluginWith(okHandler())
	p.Configure = func(context.Context, *Runtime) error { return errors.New("bad") }
	tp := startPlugin(t, p)
	if resp, err := tp.client.Configure(t.Context(), &pluginv1.ConfigureRequest{}); err != nil || resp.GetError() != "bad" {
		t.Fatalf("Configure() = %v, %v, want error %q", resp, err, "bad")
	}
	_, err := tp.client.Configure(t.Context(), &pluginv1.ConfigureRequest{})
	if got := status.Code(err); got != codes.FailedPrecondition {
		t.Errorf("Configure() after a rejected config = %v, want code %v", err, codes.FailedPrecondition)
	}
}

// echo is what echoHandler reports about the request it got.
type echo struct {
	Method        string
	Path          string
	RawQuery      string
	RequestURI    string
	Query         map[string][]string
	Header        http.Header
	Body          string
	NoBody        bool
	ContentLength int64
	RemoteAddr    string
	Host          string
}

func echoHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		e := echo{
			Method:        r.Method,
			Path:          r.URL.Path,
			RawQuery:      r.URL.RawQuery,
			RequestURI:    r.RequestURI,
			Query:         r.URL.Query(),
			Header:        r.Header,
			Body:          string(body),
			NoBody:        r.Body == http.NoBody,
			ContentLength: r.ContentLength,
			RemoteAddr:    r.RemoteAddr,
			Host:          r.Host,
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header()["Set-Cookie"] = []string{"a=1", "b=2"}
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(e)
	})
}

// TestHandlerRefuses: a handler that calls Refuse before writing anything
// answers the host that the request was not handled (ErrRefused), which
// the host may send to another process; Refuse on a writer that cannot
// refuse reports false.
func TestHandlerRefuses(t *testing.T) {
	var refused atomic.Bool
	p := pluginWith(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		refused.Store(Refuse(w))
	}))
	tp := startPlugin(t, p)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := tp.client.Configure(ctx, &pluginv1.ConfigureRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := tp.handle(ctx, &dataplane.Request{Method: "POST", Path: "/"}); !errors.Is(err, dataplane.ErrRefused) || !refused.Load() {
		t.Errorf("a handler's Refuse: RoundTrip = %v, Refuse = %t; want ErrRefused and true", err, refused.Load())
	}
	if Refuse(httptest.NewRecorder()) {
		t.Errorf("Refuse(an httptest.ResponseRecorder) = true, want false")
	}
}
