package plugintest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/plughost/plughost/host/catalog"
	"github.com/plughost/plughost/host/config"
	"github.com/plughost/plughost/host/dataplane"
	"github.com/plughost/plughost/host/metrics"
	"github.com/plughost/plughost/host/supervisor"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/wire"
)

// Option tunes Conformance.
type Option func(*conformance)

// InFlight names a request, "METHOD /path?query" relative to the mount,
// that takes a moment (a few hundred milliseconds) and then answers 200.
// The drain check holds it in flight while the plugin drains. Without it
// the drain check runs with nothing in flight and says so in the log.
func InFlight(request string) Option {
	return func(c *conformance) { c.inFlight = request }
}

// DrainDeadline sets the drain deadline the kit gives the plugin; default
// 2s. The InFlight request must finish well inside it.
func DrainDeadline(d time.Duration) Option {
	return func(c *conformance) { c.drainDeadline = d }
}

type conformance struct {
	path          string
	config        string
	durability    *durability
	inFlight      string
	drainDeadline time.Duration
	healthTimeout time.Duration
	logs          *buffer
	logger        hclog.Logger
}

// Conformance checks that the plugin binary at path is a good citizen of a
// plughost host, launching it through the host's own catalog and
// supervisor with config, the body of its config block in HCL. Each check
// is a subtest: handshake, describe, config, health, malformed_requests,
// drain, exit, metrics, and durability when the Durability option is
// given. A failure says what a good plugin does instead.
func Conformance(t *testing.T, path, config string, opts ...Option) {
	t.Helper()
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatalf("plugintest: %v", err)
	}
	c := &conformance{path: abs, config: config, drainDeadline: 2 * time.Second, healthTimeout: time.Second, logs: &buffer{}}
	for _, o := range opts {
		o(c)
	}
	c.logger = hclog.New(&hclog.LoggerOptions{Name: "host", Level: hclog.Debug, Output: c.logs})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("host and plugin log:\n%s", c.logs.String())
		}
	})

	var manifest *pluginv1.DescribeResponse
	if !t.Run("handshake", func(t *testing.T) { manifest = c.handshake(t) }) {
		return // nothing else can run
	}
	t.Run("describe", func(t *testing.T) { c.describe(t, manifest) })
	t.Run("config", func(t *testing.T) { c.configs(t, manifest) })
	t.Run("health", c.health)
	t.Run("malformed_requests", func(t *testing.T) { c.malformed(t, manifest) })
	t.Run("drain", c.drain)
	t.Run("exit", c.exit)
	t.Run("metrics", func(t *testing.T) { c.metrics(t, manifest) })
	if c.durability != nil {
		t.Run("durability", c.durable)
	}
}

func (c *conformance) launch(t *testing.T) *catalog.Instance {
	t.Helper()
	inst, err := catalog.Launch(t.Context(), c.path, "", catalog.Options{Logger: c.logger.Named("plugin"), StartTimeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("the host could not start the plugin: %v\n"+
			"A good plugin calls sdk.Serve from main, writes nothing to stdout before it, and speaks plugin protocol %d.",
			err, wire.ProtocolVersion)
	}
	t.Cleanup(inst.Kill)
	return inst
}

func (c *conformance) handshake(t *testing.T) *pluginv1.DescribeResponse {
	inst := c.launch(t)
	return inst.Manifest()
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9_-]*$`)

func (c *conformance) describe(t *testing.T, m *pluginv1.DescribeResponse) {
	if !nameRE.MatchString(m.GetName()) {
		t.Errorf("Describe name = %q; a good plugin names itself in lowercase letters, digits, '-' and '_', starting with a letter", m.GetName())
	}
	if m.GetVersion() == "" {
		t.Errorf("Describe version is empty; a good plugin reports its version so operators can tell builds apart")
	}
	if len(m.GetRoutes()) == 0 {
		t.Errorf("Describe declares no routes; the host forwards only declared routes, so the plugin is unreachable")
	}
	mux := http.NewServeMux()
	seen := map[string]bool{}
	for _, r := range m.GetRoutes() {
		pat := r.GetPattern()
		if r.GetMethod() != "" {
			pat = r.GetMethod() + " " + pat
		}
		if seen[pat] {
			t.Errorf("route %q is declared twice; declare each method and pattern once", pat)
			continue
		}
		seen[pat] = true
		if !strings.HasPrefix(r.GetPattern(), "/") {
			t.Errorf("route %q: patterns are paths relative to the mount and start with /", pat)
			continue
		}
		if r.GetTimeoutMs() < 0 {
			t.Errorf("route %q has a negative timeout", pat)
		}
		if err := register(mux, pat); err != nil {
			t.Errorf("route %q is not a usable net/http pattern: %v", pat, err)
		}
	}
	if err := config.CheckSchema(m.GetConfigSchema()); err != nil {
		t.Errorf("the declared config schema is unusable: %v", err)
	}
}

func register(mux *http.ServeMux, pat string) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%v", v)
		}
	}()
	mux.Handle(pat, http.NotFoundHandler())
	return nil
}

// start runs the plugin under the host's supervisor with the given config
// body. The supervisor is told to give up at the first crash, so a crash
// shows as the failed state instead of a silent restart.
func (c *conformance) start(t *testing.T, configSrc string) (*supervisor.Process, error) {
	t.Helper()
	return c.startIn(t, configSrc, t.TempDir())
}

// startIn is start with the plugin's data dir at dataDir.
func (c *conformance) startIn(t *testing.T, configSrc, dataDir string) (*supervisor.Process, error) {
	t.Helper()
	body, err := parseBody(configSrc)
	if err != nil {
		t.Fatalf("the config passed to Conformance does not parse: %v", err)
	}
	spec := supervisor.Spec{
		Name:        "conformance",
		Path:        c.path,
		Mount:       "/conformance",
		MaxInflight: 64,
		Required:    true,
		DataDir:     dataDir,
		Decode: func(schema *pluginv1.Schema) ([]byte, error) {
			if err := config.CheckSchema(schema); err != nil {
				return nil, err
			}
			js, diags := config.DecodePluginConfig(body, schema)
			if diags.HasErrors() {
				return nil, diags
			}
			return js, nil
		},
	}
	p, err := supervisor.Start(t.Context(), spec, supervisor.Options{
		Logger:  c.logger.Named("supervisor"),
		Metrics: metrics.New(),
		Policy: supervisor.Policy{
			InitialBackoff: 100 * time.Millisecond,
			MaxBackoff:     time.Second,
			MaxRestarts:    0,
			Window:         time.Minute,
			StableAfter:    time.Minute,
			HealthInterval: time.Hour, // the kit checks health itself
			HealthTimeout:  c.healthTimeout,
			HealthFailures: 3,
			StartTimeout:   10 * time.Second,
			Limits:         &pluginv1.Limits{MaxBodyBytes: 1 << 20, RequestTimeoutMs: 5000},
		},
	})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { p.Stop(time.Now().Add(c.drainDeadline)) })
	return p, nil
}

// ready starts the plugin with the caller's config and waits until the
// supervisor reports it ready.
func (c *conformance) ready(t *testing.T) *supervisor.Process {
	t.Helper()
	return c.readyIn(t, t.TempDir())
}

// readyIn is ready with the plugin's data dir at dataDir.
func (c *conformance) readyIn(t *testing.T, dataDir string) *supervisor.Process {
	t.Helper()
	p, err := c.startIn(t, c.config, dataDir)
	if err != nil {
		t.Fatalf("the plugin refused the config passed to Conformance: %v", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for p.Endpoint() == nil {
		st := p.Status()
		if st.State == supervisor.StateFailed || time.Now().After(deadline) {
			t.Fatalf("the plugin did not become ready (state %s, last error %q); a good plugin is ready once Configure returns", st.State, st.LastError)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return p
}

func parseBody(src string) (hcl.Body, error) {
	f, diags := hclsyntax.ParseConfig([]byte(src), "config", hcl.InitialPos)
	if diags.HasErrors() {
		return nil, diags
	}
	return f.Body, nil
}

func (c *conformance) configs(t *testing.T, m *pluginv1.DescribeResponse) {
	schema := m.GetConfigSchema()
	if body, err := parseBody(c.config); err != nil {
		t.Fatalf("the config passed to Conformance does not parse: %v", err)
	} else if _, diags := config.DecodePluginConfig(body, schema); diags.HasErrors() {
		t.Fatalf("the config passed to Conformance does not satisfy the plugin's declared schema: %v", diags)
	}

	// Violations of the declared schema must be refused before the plugin
	// sees them. These exercise the host's decoder on this schema.
	violations := map[string]string{"unknown attribute": c.config + "\nconformance_unknown_attribute = 1\n"}
	for _, a := range schema.GetAttributes() {
		switch a.GetType() {
		case "number", "bool":
			violations["wrong type for "+a.GetName()] = withAttr(c.config, a.GetName(), `["not", "a", "`+a.GetType()+`"]`)
		case "duration":
			violations["bad duration for "+a.GetName()] = withAttr(c.config, a.GetName(), `"not-a-duration"`)
		case "int":
			violations["fraction for "+a.GetName()] = withAttr(c.config, a.GetName(), `1.5`)
		}
		if a.GetRequired() {
			violations["missing required "+a.GetName()] = withoutAttr(c.config, a.GetName())
		}
	}
	for name, src := range violations {
		_, err := c.start(t, src)
		if !errors.Is(err, supervisor.ErrConfigRefused) {
			t.Errorf("%s: the host accepted a config that violates the declared schema (err = %v); declare precise types and mark required attributes Required", name, err)
		}
	}

	// The schema and Configure must agree: a config that satisfies the
	// schema with every optional attribute left to its default must be
	// accepted.
	minimal := ""
	for _, a := range schema.GetAttributes() {
		if a.GetRequired() {
			if v, ok := attrSource(c.config, a.GetName()); ok {
				minimal += a.GetName() + " = " + v + "\n"
			}
		}
	}
	if _, err := c.start(t, minimal); err != nil {
		t.Errorf("Configure refused a config that satisfies the declared schema, with every optional attribute at its default:\n%s\n%v\n"+
			"The schema and the Configure hook disagree: declare every attribute Configure reads, with the type and default it expects, "+
			"and decode it with Runtime.DecodeConfig into a struct whose json tags match the schema.", indent(minimal), err)
	}
	if _, err := c.start(t, c.config); err != nil {
		t.Errorf("the plugin refused the config passed to Conformance: %v", err)
	}
}

func indent(s string) string {
	if strings.TrimSpace(s) == "" {
		return "    (empty config block)"
	}
	return "    " + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n    ")
}

// withAttr returns src with attribute name set to the expression v.
func withAttr(src, name, v string) string {
	return withoutAttr(src, name) + "\n" + name + " = " + v + "\n"
}

// withoutAttr returns src without the top-level attribute name.
func withoutAttr(src, name string) string {
	body, err := parseBody(src)
	if err != nil {
		return src
	}
	sb := body.(*hclsyntax.Body)
	a, ok := sb.Attributes[name]
	if !ok {
		return src
	}
	r := a.SrcRange
	return src[:r.Start.Byte] + src[r.End.Byte:]
}

// attrSource returns the source text of a top-level attribute's value.
func attrSource(src, name string) (string, bool) {
	body, err := parseBody(src)
	if err != nil {
		return "", false
	}
	a, ok := body.(*hclsyntax.Body).Attributes[name]
	if !ok {
		return "", false
	}
	r := a.Expr.Range()
	return src[r.Start.Byte:r.End.Byte], true
}

func (c *conformance) health(t *testing.T) {
	p := c.ready(t)
	ctx, cancel := context.WithTimeout(t.Context(), c.healthTimeout)
	defer cancel()
	start := time.Now()
	resp, err := p.Endpoint().RPC.Health(ctx, &pluginv1.HealthRequest{})
	if err != nil {
		t.Fatalf("Health did not answer within %v: %v; a good Health hook answers at once from state it keeps, without slow I/O", c.healthTimeout, err)
	}
	if resp.GetStatus() == pluginv1.HealthResponse_STATUS_NOT_READY {
		t.Errorf("Health reports not ready (%q) right after Configure; a good plugin is ready, or degraded with a reason, once configured", resp.GetReason())
	}
	if resp.GetStatus() == pluginv1.HealthResponse_STATUS_DEGRADED && resp.GetReason() == "" {
		t.Errorf("Health reports degraded without a reason; say why, operators see it in /readyz")
	}
	t.Logf("health answered %s in %v", resp.GetStatus(), time.Since(start).Round(time.Millisecond))
}

// malformed sends each declared route bad input straight over the data
// plane, past the ingress's checks, as a hostile client could through a
// host with looser limits, and checks that the plugin
// answers each with less than 500 and stays up.
func (c *conformance) malformed(t *testing.T, m *pluginv1.DescribeResponse) {
	p := c.ready(t)
	pid := p.Status().Pid
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i*7 + i>>8)
	}
	type probe struct {
		what string
		req  *pluginv1.HTTPRequest
	}
	var probes []probe
	for _, r := range m.GetRoutes() {
		method := r.GetMethod()
		if method == "" {
			method = http.MethodPost
		}
		path := concretePath(r.GetPattern())
		base := func() *pluginv1.HTTPRequest {
			return &pluginv1.HTTPRequest{Method: method, Path: path, Pattern: r.GetPattern(), RemoteAddr: "192.0.2.1:1234", Host: "conformance"}
		}
		for _, pr := range []struct {
			what string
			mut  func(*pluginv1.HTTPRequest)
		}{
			{"truncated JSON", func(q *pluginv1.HTTPRequest) {
				q.Body = []byte(`{"a": [1, 2`)
				q.Headers = []*pluginv1.Header{{Name: "Content-Type", Values: []string{"application/json"}}}
			}},
			{"JSON of the wrong shape", func(q *pluginv1.HTTPRequest) {
				q.Body = []byte(`[null, true, {"": -1e999}]`)
				q.Headers = []*pluginv1.Header{{Name: "Content-Type", Values: []string{"application/json"}}}
			}},
			{"1 MiB of binary noise", func(q *pluginv1.HTTPRequest) { q.Body = big }},
			{"invalid UTF-8 and junk in the query", func(q *pluginv1.HTTPRequest) { q.RawQuery = "a=%ff%fe&%zz=1&;;&=&x=" + strings.Repeat("9", 400) }},
			{"a 64 KiB header", func(q *pluginv1.HTTPRequest) {
				q.Headers = []*pluginv1.Header{{Name: "X-Junk", Values: []string{strings.Repeat("j", 64<<10)}}, {Name: "Content-Length", Values: []string{"-1"}}}
			}},
			{"a lying Content-Encoding", func(q *pluginv1.HTTPRequest) {
				q.Body = []byte("not gzip at all")
				q.Headers = []*pluginv1.Header{{Name: "Content-Encoding", Values: []string{"gzip"}}, {Name: "Content-Type", Values: []string{"application/json"}}}
			}},
		} {
			req := base()
			pr.mut(req)
			probes = append(probes, probe{what: fmt.Sprintf("%s %s with %s", method, path, pr.what), req: req})
			if r.GetStreaming() {
				probes[len(probes)-1].req.Pattern = "stream:" + r.GetPattern()
			}
		}
	}
	conn := p.Endpoint()
	for _, pr := range probes {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		code, err := call(ctx, conn, pr.req)
		timedOut := ctx.Err() != nil
		cancel()
		dead := !alive(pid)
		if err != nil && !dead {
			// A crash fails the call as its sockets close, a moment
			// before the process is gone.
			for end := time.Now().Add(2 * time.Second); !dead && time.Now().Before(end); dead = !alive(pid) {
				time.Sleep(10 * time.Millisecond)
			}
		}
		switch {
		case dead:
			// Checked first: a crash also fails the call.
			t.Fatalf("%s: the plugin process died (%v); a good plugin never crashes on bad input — "+
				"validate input, and recover panics in goroutines you start", pr.what, err)
		case err != nil && timedOut:
			// A long poll may legitimately wait; not answering bad input
			// quickly is not a crash.
			t.Logf("%s: no answer within 2s", pr.what)
		case err != nil:
			t.Errorf("%s: the call failed: %v; a good plugin answers bad input with a 4xx and keeps running", pr.what, err)
		case code >= 500 && code != http.StatusServiceUnavailable:
			t.Errorf("%s: answered %d; bad input should get a 4xx with a JSON error (a 500 usually means a panic: see the plugin log)", pr.what, code)
		}
		if st := p.Status(); st.State != supervisor.StateReady || st.Pid != pid {
			t.Fatalf("%s: the plugin process died (state %s, last error %q); a good plugin never crashes on bad input — "+
				"validate input, and recover panics in goroutines you start", pr.what, st.State, st.LastError)
		}
	}
}

// concretePath fills a pattern's wildcards with plausible segments.
func concretePath(pattern string) string {
	pattern = strings.TrimSuffix(pattern, "{$}")
	segs := strings.Split(pattern, "/")
	for i, s := range segs {
		if strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") {
			segs[i] = "conformance%20%00x"
		}
	}
	return strings.Join(segs, "/")
}

// call sends req over the plugin's data plane, as a streaming route's
// when its pattern is marked "stream:", and returns the status.
func call(ctx context.Context, conn *supervisor.Endpoint, req *pluginv1.HTTPRequest) (int, error) {
	resp, err := roundTrip(ctx, conn, req)
	if err != nil {
		return 0, err
	}
	resp.Close()
	return resp.Status, nil
}

// roundTrip sends req over the plugin's data plane and returns the head of
// the answer; the caller closes it.
func roundTrip(ctx context.Context, conn *supervisor.Endpoint, req *pluginv1.HTTPRequest) (*dataplane.Response, error) {
	pat, streaming := strings.CutPrefix(req.GetPattern(), "stream:")
	if !streaming {
		pat = req.GetPattern()
	}
	h := http.Header{}
	wire.HeadersFromProto(h, req.GetHeaders())
	return conn.RoundTrip(ctx, &dataplane.Request{
		Method: req.GetMethod(), Path: req.GetPath(), RawQuery: req.GetRawQuery(), Header: h, Body: [][]byte{req.GetBody()},
		RemoteAddr: req.GetRemoteAddr(), Host: req.GetHost(), Pattern: pat, Streaming: streaming,
	})
}

func (c *conformance) drain(t *testing.T) {
	if c.inFlight == "" {
		t.Log("no InFlight request given: checking drain with nothing in flight")
	}
	// The in-flight request must reach the plugin before the drain does;
	// nothing outside the plugin can see that, so the drain response says
	// whether it did and the check is repeated with a longer head start.
	for _, headStart := range []time.Duration{20 * time.Millisecond, 100 * time.Millisecond, 300 * time.Millisecond, time.Second} {
		if done := c.drainOnce(t, headStart); done {
			return
		}
	}
	t.Fatalf("the InFlight request %q never reached the plugin before the drain began; give a request that takes a few hundred milliseconds", c.inFlight)
}

// drainOnce runs one drain check; false means the in-flight request had
// not arrived when the drain began, so the check must be repeated.
func (c *conformance) drainOnce(t *testing.T, headStart time.Duration) bool {
	p := c.ready(t)
	conn := p.Endpoint()
	rpc := conn.RPC
	type result struct {
		code int
		err  error
	}
	var inflight chan result
	if c.inFlight != "" {
		req, err := parseRequest(c.inFlight)
		if err != nil {
			t.Fatalf("InFlight(%q): %v", c.inFlight, err)
		}
		inflight = make(chan result, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), c.drainDeadline+5*time.Second)
			defer cancel()
			code, err := call(ctx, conn, req)
			inflight <- result{code, err}
		}()
		// Give the request a head start; whether it got there is read
		// from the drain response below, not assumed.
		time.Sleep(headStart)
	}
	deadline := time.Now().Add(c.drainDeadline)
	ctx, cancel := context.WithDeadline(t.Context(), deadline.Add(time.Second))
	defer cancel()
	start := time.Now()
	resp, err := rpc.Drain(ctx, &pluginv1.DrainRequest{DeadlineUnixNano: deadline.UnixNano()})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Drain did not return by its deadline (%v) plus 1s: %v; a good Drain hook returns when its ctx is done, "+
			"and handlers return when r.Context() is done", c.drainDeadline, err)
	}
	if inflight != nil {
		if resp.GetCompleted()+resp.GetAbandoned() == 0 {
			r := <-inflight
			if r.code == http.StatusServiceUnavailable {
				return false // it arrived after the drain began
			}
			if r.err == nil && r.code < 300 && headStart < time.Second {
				return false // it finished before the drain began
			}
		}
		if resp.GetAbandoned() > 0 {
			t.Errorf("%d request(s) still running at the drain deadline (%v); a good plugin finishes in-flight work "+
				"within the deadline, or returns when r.Context() is done", resp.GetAbandoned(), c.drainDeadline)
		}
		select {
		case r := <-inflight:
			if r.err != nil || r.code != http.StatusOK {
				t.Errorf("the in-flight request %q ended with %d, %v during the drain; a good plugin lets it finish with 200", c.inFlight, r.code, r.err)
			}
		case <-time.After(c.drainDeadline + 5*time.Second):
			t.Errorf("the in-flight request %q did not finish", c.inFlight)
		}
	}
	if took > c.drainDeadline+500*time.Millisecond {
		t.Errorf("Drain took %v with a %v deadline; it must return by the deadline", took, c.drainDeadline)
	}
	// New work after the drain began must be refused.
	probe := &pluginv1.HTTPRequest{Method: http.MethodGet, Path: "/", Host: "conformance"}
	if c.inFlight != "" {
		probe, _ = parseRequest(c.inFlight)
	}
	hctx, hcancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer hcancel()
	out, err := roundTrip(hctx, conn, probe)
	switch {
	case errors.Is(err, dataplane.ErrRefused):
		// Refused unrun: the host sends it to the replacing instance.
	case err != nil:
		t.Errorf("a request after Drain failed: %v; a good plugin refuses it (the SDK does) or answers 503 with Retry-After", err)
	case out.Status != http.StatusServiceUnavailable || out.Header.Get("Retry-After") == "":
		out.Close()
		t.Errorf("a request after Drain got %d; a good plugin refuses new work once draining (the SDK does), or answers 503 with Retry-After", out.Status)
	default:
		out.Close()
	}
	return true
}

// parseRequest turns "METHOD /path?query" into a request.
func parseRequest(s string) (*pluginv1.HTTPRequest, error) {
	method, target, ok := strings.Cut(strings.TrimSpace(s), " ")
	if !ok || !strings.HasPrefix(target, "/") {
		return nil, fmt.Errorf("want \"METHOD /path?query\"")
	}
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	return &pluginv1.HTTPRequest{Method: method, Path: u.Path, RawQuery: u.RawQuery, Host: "conformance", RemoteAddr: "192.0.2.1:1234"}, nil
}

func (c *conformance) exit(t *testing.T) {
	t.Run("when_told", func(t *testing.T) {
		inst := c.launch(t)
		pid := inst.Pid()
		start := time.Now()
		inst.Kill()
		// go-plugin force-kills after 2s; a plugin that needed that did
		// not exit when told.
		if d := time.Since(start); d >= 2*time.Second {
			t.Errorf("the plugin took %v to exit after the host closed its connection and was force-killed; "+
				"a good plugin returns from main when sdk.Serve returns", d.Round(time.Millisecond))
		}
		if alive(pid) {
			t.Errorf("plugin process %d is still running after Kill", pid)
		}
	})
	t.Run("when_host_dies", func(t *testing.T) {
		// A stand-in host: a shell that starts the plugin with the
		// handshake environment and is then killed with SIGKILL. The
		// plugin must notice that its parent is gone.
		cmd := exec.Command("/bin/sh", "-c", `"$0" & echo "$!"; wait`, c.path)
		cmd.Env = append(os.Environ(),
			wire.Handshake.MagicCookieKey+"="+wire.Handshake.MagicCookieValue,
			"PLUGIN_PROTOCOL_VERSIONS="+strconv.Itoa(wire.ProtocolVersion))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start stand-in host: %v", err)
		}
		sc := bufio.NewScanner(out)
		var pid int
		if sc.Scan() {
			pid, _ = strconv.Atoi(strings.TrimSpace(sc.Text()))
		}
		if pid <= 0 {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("could not read the plugin's pid from the stand-in host")
		}
		t.Cleanup(func() { kill(pid) })
		// Wait for the handshake line: the plugin is serving.
		if !sc.Scan() {
			t.Fatalf("the plugin printed no handshake line under the stand-in host")
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		killed := time.Now()
		for alive(pid) {
			if time.Since(killed) > 2*time.Second {
				t.Fatalf("plugin process %d was still running 2s after its host died; plugins built with sdk.Serve exit by "+
					"themselves when their host is gone — do not start it detached or outside sdk.Serve", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func (c *conformance) metrics(t *testing.T, m *pluginv1.DescribeResponse) {
	p := c.ready(t)
	// Exercise the plugin a little so lazily created series exist.
	for _, r := range m.GetRoutes() {
		if r.GetMethod() == http.MethodGet && !r.GetStreaming() && !strings.Contains(r.GetPattern(), "{") || r.GetPattern() == "/{$}" {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			_, _ = call(ctx, p.Endpoint(), &pluginv1.HTTPRequest{Method: http.MethodGet, Path: concretePath(r.GetPattern()), Host: "conformance"})
			cancel()
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	resp, err := p.Endpoint().RPC.Metrics(ctx, &pluginv1.MetricsRequest{})
	if err != nil {
		t.Fatalf("Metrics failed: %v; a good plugin registers only collectors that gather without error", err)
	}
	fams, err := metrics.Relabel("conformance", resp.GetFamilies())
	if err != nil {
		t.Errorf("the host drops some of the plugin's metrics: %v", err)
	}
	var text strings.Builder
	for _, mf := range fams {
		if _, err := expfmt.MetricFamilyToText(&text, mf); err != nil {
			t.Errorf("metric family %q cannot be written as Prometheus text: %v", mf.GetName(), err)
		}
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	if _, err := parser.TextToMetricFamilies(strings.NewReader(text.String())); err != nil {
		t.Errorf("the plugin's metrics do not parse as Prometheus exposition: %v", err)
	}
	problems, err := promlint.New(strings.NewReader(text.String())).Lint()
	if err != nil {
		t.Errorf("promlint could not read the metrics: %v", err)
	}
	for _, pr := range problems {
		t.Errorf("metric %s: %s (promlint); follow the Prometheus naming conventions", pr.Metric, pr.Text)
	}
}
