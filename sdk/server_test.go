package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
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

func TestHandleRequest(t *testing.T) {
	tests := []struct {
		name string
		req  *dataplane.Request
		want echo
	}{
		{
			name: "post with body, query and headers",
			req: &dataplane.Request{
				Method:   "POST",
				Path:     "/items/42",
				RawQuery: "a=1&b=two%20words&a=3",
				// Names as the host may send them: the plugin
				// canonicalises them.
				Header: http.Header{
					"content-type": {"application/json"},
					"X-Multi":      {"1", "2"},
				},
				Body:       [][]byte{[]byte(`{"x":1}`)},
				RemoteAddr: "203.0.113.7:5555",
				Host:       "example.com",
				Pattern:    "POST /items/{id}",
				RequestID:  "req-1",
			},
			want: echo{
				Method:        "POST",
				Path:          "/items/42",
				RawQuery:      "a=1&b=two%20words&a=3",
				RequestURI:    "/items/42?a=1&b=two%20words&a=3",
				Query:         map[string][]string{"a": {"1", "3"}, "b": {"two words"}},
				Header:        http.Header{"Content-Type": {"application/json"}, "X-Multi": {"1", "2"}},
				Body:          `{"x":1}`,
				ContentLength: 7,
				RemoteAddr:    "203.0.113.7:5555",
				Host:          "example.com",
			},
		},
		{
			name: "get without body",
			req:  &dataplane.Request{Method: "GET", Path: "/", RemoteAddr: "[::1]:1"},
			want: echo{
				Method:     "GET",
				Path:       "/",
				RequestURI: "/",
				Query:      map[string][]string{},
				Header:     http.Header{},
				NoBody:     true,
				RemoteAddr: "[::1]:1",
			},
		},
		{
			name: "path needing escapes",
			req:  &dataplane.Request{Method: "DELETE", Path: "/files/a b/ü"},
			want: echo{
				Method:     "DELETE",
				Path:       "/files/a b/ü",
				RequestURI: "/files/a%20b/%C3%BC",
				Query:      map[string][]string{},
				Header:     http.Header{},
				NoBody:     true,
			},
		},
		{
			// Over a piece: the body comes in pieces, and without a
			// Content-Length header its length is unknown.
			name: "body in pieces",
			req:  &dataplane.Request{Method: "PUT", Path: "/blob", Body: [][]byte{bytes.Repeat([]byte("x"), wire.PieceBytes+1)}},
			want: echo{
				Method:        "PUT",
				Path:          "/blob",
				RequestURI:    "/blob",
				Query:         map[string][]string{},
				Header:        http.Header{},
				Body:          strings.Repeat("x", wire.PieceBytes+1),
				ContentLength: -1,
			},
		},
	}
	tp := startPlugin(t, pluginWith(echoHandler()))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := tp.handle(t.Context(), tt.req)
			if err != nil {
				t.Fatalf("handle(%s %s) = %v", tt.req.Method, tt.req.Path, err)
			}
			if resp.status != http.StatusCreated {
				t.Errorf("handle(%s %s).status = %d, want %d; body %q", tt.req.Method, tt.req.Path, resp.status, http.StatusCreated, resp.body)
			}
			wantHeader := http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"a=1", "b=2"}}
			if diff := cmp.Diff(wantHeader, resp.header); diff != "" {
				t.Errorf("handle(%s %s) headers mismatch (-want +got):\n%s", tt.req.Method, tt.req.Path, diff)
			}
			var got echo
			if err := json.Unmarshal(resp.body, &got); err != nil {
				t.Fatalf("handle(%s %s).body = %q, not JSON: %v", tt.req.Method, tt.req.Path, resp.body, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("request seen by the handler mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHandleBadRequest(t *testing.T) {
	tp := startPlugin(t, pluginWith(echoHandler()))
	resp, err := tp.handle(t.Context(), &dataplane.Request{Method: "BAD METHOD", Path: "/"})
	if err != nil {
		t.Fatalf("handle(BAD METHOD) = %v", err)
	}
	if resp.status != http.StatusBadRequest {
		t.Errorf("handle(BAD METHOD).status = %d, want %d", resp.status, http.StatusBadRequest)
	}
	if got := decodeError(t, resp.body).Error.Code; got != "bad_request" {
		t.Errorf("handle(BAD METHOD) error code = %q, want %q", got, "bad_request")
	}
}

func TestHandleResponse(t *testing.T) {
	tests := []struct {
		name       string
		handler    http.HandlerFunc
		wantStatus int
		wantHeader http.Header
		wantBody   string
	}{
		{
			name:       "nothing written",
			handler:    func(http.ResponseWriter, *http.Request) {},
			wantStatus: 200,
			wantHeader: http.Header{},
		},
		{
			name:       "status only",
			handler:    func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) },
			wantStatus: 204,
			wantHeader: http.Header{},
		},
		{
			name:       "body without WriteHeader",
			handler:    func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hello") },
			wantStatus: 200,
			wantHeader: http.Header{},
			wantBody:   "hello",
		},
		{
			name: "second WriteHeader ignored",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusAccepted)
				w.WriteHeader(http.StatusTeapot)
				io.WriteString(w, "a")
				io.WriteString(w, "b")
			},
			wantStatus: 202,
			wantHeader: http.Header{},
			wantBody:   "ab",
		},
		{
			name: "headers",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Location", "/items/7")
				w.Header().Add("Vary", "Accept")
				w.Header().Add("Vary", "Origin")
				w.WriteHeader(http.StatusSeeOther)
			},
			wantStatus: 303,
			wantHeader: http.Header{"Location": {"/items/7"}, "Vary": {"Accept", "Origin"}},
		},
		{
			name:       "http.Error",
			handler:    func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "nope", http.StatusForbidden) },
			wantStatus: 403,
			wantHeader: http.Header{"Content-Type": {"text/plain; charset=utf-8"}, "X-Content-Type-Options": {"nosniff"}},
			wantBody:   "nope\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp := startPlugin(t, pluginWith(tt.handler))
			resp, err := tp.handle(t.Context(), &dataplane.Request{Method: "GET", Path: "/"})
			if err != nil {
				t.Fatalf("handle() = %v", err)
			}
			if resp.status != tt.wantStatus {
				t.Errorf("handle().status = %d, want %d", resp.status, tt.wantStatus)
			}
			if diff := cmp.Diff(tt.wantHeader, resp.header); diff != "" {
				t.Errorf("handle() headers mismatch (-want +got):\n%s", diff)
			}
			if string(resp.body) != tt.wantBody {
				t.Errorf("handle().body = %q, want %q", resp.body, tt.wantBody)
			}
		})
	}
}

func TestHandleDeadline(t *testing.T) {
	const noDeadline = "none"
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dl, ok := r.Context().Deadline()
		if !ok {
			io.WriteString(w, noDeadline)
			return
		}
		io.WriteString(w, dl.Format(time.RFC3339Nano))
	})
	tp := startPlugin(t, pluginWith(h))

	t.Run("caller deadline", func(t *testing.T) {
		want := time.Now().Add(30 * time.Second)
		ctx, cancel := context.WithDeadline(t.Context(), want)
		defer cancel()
		resp, err := tp.handle(ctx, &dataplane.Request{Method: "GET", Path: "/"})
		if err != nil {
			t.Fatalf("handle() = %v", err)
		}
		got, err := time.Parse(time.RFC3339Nano, string(resp.body))
		if err != nil {
			t.Fatalf("handler saw deadline %q, want %v", resp.body, want)
		}
		// The deadline travels as a time, to the nanosecond: host and
		// plugin share a clock.
		if !got.Equal(want) {
			t.Errorf("r.Context().Deadline() = %v, want %v", got, want)
		}
	})
	t.Run("no deadline", func(t *testing.T) {
		resp, err := tp.handle(t.Context(), &dataplane.Request{Method: "GET", Path: "/"})
		if err != nil {
			t.Fatalf("handle() = %v", err)
		}
		if got := string(resp.body); got != noDeadline {
			t.Errorf("r.Context().Deadline() = %s, want no deadline", got)
		}
	})
}

func TestHandleCancel(t *testing.T) {
	started := make(chan struct{})
	ended := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-r.Context().Done()
		ended <- r.Context().Err()
	})
	tp := startPlugin(t, pluginWith(h))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	c := tp.goHandle(ctx, &dataplane.Request{Method: "GET", Path: "/"})
	waitFor(t, started, "the handler to start")
	cancel()
	if _, err := c.wait(t); !errors.Is(err, context.Canceled) {
		t.Errorf("handle() after cancel = %v, want %v", err, context.Canceled)
	}
	if err := waitFor(t, ended, "the handler to see the cancellation"); !errors.Is(err, context.Canceled) {
		t.Errorf("r.Context().Err() = %v, want %v", err, context.Canceled)
	}
}

func TestHandlePanic(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
	}{
		{
			name:    "before writing",
			handler: func(http.ResponseWriter, *http.Request) { panic("boom") },
		},
		{
			name: "after setting headers",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Encoding", "gzip")
				w.Header().Set("X-Partial", "yes")
				panic("boom")
			},
		},
		{
			// Nothing has left the plugin yet, so the handler's head and
			// half a body are replaced, not sent as if complete.
			name: "after writing the head and some body",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("X-Partial", "yes")
				w.WriteHeader(http.StatusAccepted)
				io.WriteString(w, "partial")
				panic(fmt.Errorf("boom"))
			},
		},
		{
			// An ordinary route's response goes whole when the handler
			// returns: Flush sends nothing, so it can still be replaced.
			name: "after flushing",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("X-Partial", "yes")
				io.WriteString(w, "partial")
				w.(http.Flusher).Flush()
				panic("boom")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mux := http.NewServeMux()
			mux.Handle("/panic", tt.handler)
			mux.Handle("/ok", okHandler())
			tp := startPlugin(t, pluginWith(mux))

			resp, err := tp.handle(t.Context(), &dataplane.Request{Method: "GET", Path: "/panic", RequestID: "req-9"})
			if err != nil {
				t.Fatalf("handle(/panic) = %v, want a 500 response", err)
			}
			if resp.status != http.StatusInternalServerError {
				t.Errorf("handle(/panic).status = %d, want %d", resp.status, http.StatusInternalServerError)
			}
			wantHeader := http.Header{"Content-Type": {"application/json"}}
			if diff := cmp.Diff(wantHeader, resp.header); diff != "" {
				t.Errorf("handle(/panic) headers mismatch (-want +got):\n%s", diff)
			}
			if got := decodeError(t, resp.body).Error.Code; got != "internal" {
				t.Errorf("handle(/panic) error code = %q, want %q; body %q", got, "internal", resp.body)
			}

			recs := tp.logs.records(t, "handler panicked")
			if len(recs) != 1 {
				t.Fatalf("log has %d %q records, want 1; log:\n%s", len(recs), "handler panicked", tp.logs)
			}
			rec := recs[0]
			if rec["@level"] != "error" || rec["panic"] != "boom" || rec["path"] != "/panic" || rec["request_id"] != "req-9" {
				t.Errorf("panic log record = %v, want level error, panic boom, path /panic, request_id req-9", rec)
			}
			if stack, _ := rec["stack"].(string); !strings.Contains(stack, "server_test.go") {
				t.Errorf("panic log stack = %q, want the handler's stack", stack)
			}

			resp, err = tp.handle(t.Context(), &dataplane.Request{Method: "GET", Path: "/ok"})
			if err != nil || resp.status != http.StatusOK || string(resp.body) != "ok" {
				t.Errorf("handle(/ok) after a panic = %v, %v, want 200 ok", resp, err)
			}
		})
	}
}

func TestHandleAbort(t *testing.T) {
	tp := startPlugin(t, pluginWith(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "half")
		panic(http.ErrAbortHandler)
	})))
	if _, err := tp.handle(t.Context(), &dataplane.Request{Method: "GET", Path: "/"}); !errors.Is(err, dataplane.ErrAborted) {
		t.Errorf("handle() of a handler that panics with http.ErrAbortHandler = %v, want %v", err, dataplane.ErrAborted)
	}
	if recs := tp.logs.records(t, "handler panicked"); len(recs) != 0 {
		t.Errorf("log has %d %q records for http.ErrAbortHandler, want 0", len(recs), "handler panicked")
	}
}

func TestHandleStreamFlush(t *testing.T) {
	flushed := wiretest.NewGate(t)
	finished := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(finished)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		flushed.Wait(r) // the client must see "first" before we go on
		io.WriteString(w, "second\n")
		w.(http.Flusher).Flush()
		io.WriteString(w, "third\n")
	})
	p := pluginWith(h)
	p.Routes = muxWith(func(m *Mux) { m.Handle("/events", h, Streaming()) })
	tp := startPlugin(t, p)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := tp.data.RoundTrip(ctx, &dataplane.Request{Method: "GET", Path: "/events", Streaming: true})
	if err != nil {
		t.Fatalf("RoundTrip() = %v", err)
	}
	defer resp.Close()
	first, err := resp.Next()
	if err != nil {
		t.Fatalf("first Next() = %v, want the flushed piece", err)
	}
	select {
	case <-finished:
		t.Fatal("handler finished before the client got the first piece")
	default:
	}
	if resp.Status != http.StatusAccepted || string(first) != "first\n" {
		t.Errorf("first piece = status %d data %q, want status %d data %q", resp.Status, first, http.StatusAccepted, "first\n")
	}
	if diff := cmp.Diff(http.Header{"Content-Type": {"text/event-stream"}}, resp.Header); diff != "" {
		t.Errorf("headers mismatch (-want +got):\n%s", diff)
	}
	flushed.Open()

	rest, err := readPieces(resp)
	if err != nil {
		t.Fatalf("Next() = %v, want the rest of the stream", err)
	}
	var data []string
	for _, b := range rest {
		data = append(data, string(b))
	}
	if diff := cmp.Diff([]string{"second\n", "third\n"}, data); diff != "" {
		t.Errorf("pieces after the first mismatch (-want +got):\n%s", diff)
	}
	waitFor(t, finished, "the handler to finish")
}

func TestHandleStreamPieces(t *testing.T) {
	const piece = wire.PieceBytes
	tests := []struct {
		name      string
		streaming bool
		write     func(w io.Writer, data []byte)
		size      int
		// wantPieces is how many pieces Next returns; wantSize is
		// Response.Size, -1 when unknown.
		wantPieces int
		wantSize   int64
	}{
		{"empty", true, func(io.Writer, []byte) {}, 0, 0, 0},
		{"small", true, func(w io.Writer, b []byte) { w.Write(b) }, 100, 1, 100},
		// A full buffer is sent at once, so the end adds no piece.
		{"one write of exactly a piece", true, func(w io.Writer, b []byte) { w.Write(b) }, piece, 1, -1},
		{"one big write", true, func(w io.Writer, b []byte) { w.Write(b) }, 100 << 10, 2, -1},
		{"many small writes", true, func(w io.Writer, b []byte) {
			for len(b) > 0 {
				n := min(len(b), 1000)
				w.Write(b[:n])
				b = b[n:]
			}
		}, 100 << 10, 2, -1},
		// Beyond the response window: the handler waits for credit as
		// the client reads.
		{"one write beyond the window", true, func(w io.Writer, b []byte) { w.Write(b) }, 4<<20 + 1, 4<<20/piece + 1, -1},
		// An ordinary route sends the whole response when the handler
		// returns, in pieces, with its length.
		{"ordinary route, many small writes", false, func(w io.Writer, b []byte) {
			for len(b) > 0 {
				n := min(len(b), 1000)
				w.Write(b[:n])
				w.(http.Flusher).Flush()
				b = b[n:]
			}
		}, 100 << 10, 2, 100 << 10},
		{"ordinary route beyond the window", false, func(w io.Writer, b []byte) { w.Write(b) }, 4<<20 + 1, 4<<20/piece + 1, 4<<20 + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := bytes.Repeat([]byte("0123456789abcdef"), tt.size/16+1)[:tt.size]
			h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/octet-stream")
				tt.write(w, data)
			})
			p := pluginWith(h)
			opts := []RouteOption{}
			if tt.streaming {
				opts = append(opts, Streaming())
			}
			p.Routes = muxWith(func(m *Mux) { m.Handle("/", h, opts...) })
			tp := startPlugin(t, p)
			resp, pieces, err := tp.handleStream(t.Context(), &dataplane.Request{Method: "GET", Path: "/", Streaming: tt.streaming})
			if err != nil {
				t.Fatalf("handleStream() = %v after %d pieces", err, len(pieces))
			}
			if resp.Status != http.StatusOK || resp.Header.Get("Content-Type") != "application/octet-stream" {
				t.Errorf("head = status %d headers %v, want status 200 and the handler's header", resp.Status, resp.Header)
			}
			if resp.Size != tt.wantSize {
				t.Errorf("Response.Size = %d, want %d", resp.Size, tt.wantSize)
			}
			if len(pieces) != tt.wantPieces {
				t.Errorf("got %d pieces, want %d", len(pieces), tt.wantPieces)
			}
			for i, b := range pieces {
				if len(b) > piece {
					t.Errorf("piece %d has %d bytes, want at most %d", i, len(b), piece)
				}
			}
			if got := bytes.Join(pieces, nil); !bytes.Equal(got, data) {
				t.Errorf("body has %d bytes, want the %d written", len(got), len(data))
			}
		})
	}
}

func TestHandleStreamCallerGone(t *testing.T) {
	writeErr := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Stream until a write fails, as a handler that ignores
		// r.Context() would; the 10s bound only keeps a broken SDK from
		// hanging the test.
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
			if _, err := io.WriteString(w, "tick\n"); err != nil {
				writeErr <- err
				return
			}
			w.(http.Flusher).Flush()
		}
		writeErr <- nil
	})
	p := pluginWith(h)
	p.Routes = muxWith(func(m *Mux) { m.Handle("/", h, Streaming()) })
	tp := startPlugin(t, p)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp, err := tp.data.RoundTrip(ctx, &dataplane.Request{Method: "GET", Path: "/", Streaming: true})
	if err != nil {
		t.Fatalf("RoundTrip() = %v", err)
	}
	if _, err := resp.Next(); err != nil {
		t.Fatalf("first Next() = %v", err)
	}
	cancel()
	// The host gives up on the request as it reads on or closes it.
	resp.Close()
	if err := waitFor(t, writeErr, "the handler to stop writing"); err == nil {
		t.Errorf("Write() after the caller went away = nil for 10s, want an error")
	}
}

func TestHandleStreamPanic(t *testing.T) {
	tests := []struct {
		name string
		// handler panics with "boom" or http.ErrAbortHandler.
		handler http.HandlerFunc
		// wantHead is the status of the response.
		wantHead int
		// wantErr is the error that ends its body, nil for its end.
		wantErr error
		wantLog bool
	}{
		{
			name:     "before writing",
			handler:  func(http.ResponseWriter, *http.Request) { panic("boom") },
			wantHead: http.StatusInternalServerError,
			wantLog:  true,
		},
		{
			name: "after writing but before flushing",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusAccepted)
				io.WriteString(w, "partial")
				panic("boom")
			},
			wantHead: http.StatusInternalServerError,
			wantLog:  true,
		},
		{
			// The head is out: the only honest end is an aborted
			// response, so that the host cuts it short.
			name: "after flushing",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(http.StatusAccepted)
				io.WriteString(w, "partial")
				w.(http.Flusher).Flush()
				panic("boom")
			},
			wantHead: http.StatusAccepted,
			wantErr:  dataplane.ErrAborted,
			wantLog:  true,
		},
		{
			name: "http.ErrAbortHandler after flushing",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				io.WriteString(w, "partial")
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			},
			wantHead: http.StatusOK,
			wantErr:  dataplane.ErrAborted,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pluginWith(tt.handler)
			p.Routes = muxWith(func(m *Mux) { m.Handle("/", tt.handler, Streaming()) })
			tp := startPlugin(t, p)
			resp, pieces, err := tp.handleStream(t.Context(), &dataplane.Request{Method: "GET", Path: "/", Streaming: true})
			if resp == nil {
				t.Fatalf("handleStream() = %v, want a response", err)
			}
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("handleStream() body ended with %v, want %v", err, tt.wantErr)
			}
			if resp.Status != tt.wantHead {
				t.Errorf("status = %d, want %d", resp.Status, tt.wantHead)
			}
			body := bytes.Join(pieces, nil)
			if tt.wantHead == http.StatusInternalServerError {
				if got := decodeError(t, body).Error.Code; got != "internal" {
					t.Errorf("handleStream() error code = %q, want %q", got, "internal")
				}
			} else if string(body) != "partial" {
				t.Errorf("body = %q, want the part flushed", body)
			}
			recs := tp.logs.records(t, "handler panicked")
			if got := len(recs) == 1; got != tt.wantLog {
				t.Errorf("log has %d %q records, want logged = %t", len(recs), "handler panicked", tt.wantLog)
			}
		})
	}
}

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
