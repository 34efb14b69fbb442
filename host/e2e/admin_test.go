package e2e

import (
	"encoding/json"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// adminPlugins returns GET /v1/plugins, authenticated with hdr.
func adminPlugins(t *testing.T, h *hostProc, hdr http.Header) map[string]pluginStatus {
	t.Helper()
	resp, body := mustRequest(t, http.MethodGet, h.admin+"/v1/plugins", nil, hdr)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/plugins = %d %s, want 200", resp.StatusCode, body)
	}
	var list []pluginStatus
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatalf("decode /v1/plugins: %v: %s", err, body)
	}
	out := map[string]pluginStatus{}
	for _, p := range list {
		out[p.Name] = p
	}
	return out
}

func TestAdminAPI(t *testing.T) {
	const token = "s3cret-admin-token"
	cfg, _ := tokenConfig(t, "2s", token)
	h := startHost(t, cfg+pluginBlock("hello", "hello", "")+pluginBlock("faulty", "faulty", ""))
	auth := http.Header{"Authorization": {"Bearer " + token}}

	t.Run("auth", func(t *testing.T) {
		tests := []struct {
			name   string
			method string
			path   string
			hdr    http.Header
			want   int
		}{
			{"list without a token", "GET", "/v1/plugins", nil, http.StatusUnauthorized},
			{"list with a wrong token", "GET", "/v1/plugins", http.Header{"Authorization": {"Bearer nope"}}, http.StatusUnauthorized},
			{"list with the token but no Bearer", "GET", "/v1/plugins", http.Header{"Authorization": {token}}, http.StatusUnauthorized},
			{"restart without a token", "POST", "/v1/plugins/hello/restart", nil, http.StatusUnauthorized},
			{"list with the token", "GET", "/v1/plugins", auth, http.StatusOK},
			{"metrics without a token", "GET", "/metrics", nil, http.StatusOK},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				resp, body := mustRequest(t, tt.method, h.admin+tt.path, nil, tt.hdr)
				if tt.want == http.StatusUnauthorized {
					checkJSONError(t, tt.method+" "+tt.path, resp, body, tt.want, "unauthorized")
					return
				}
				if resp.StatusCode != tt.want {
					t.Errorf("%s %s = %d %s, want %d", tt.method, tt.path, resp.StatusCode, body, tt.want)
				}
			})
		}
	})
	// The unauthorized restart above must not have restarted anything.
	ps := adminPlugins(t, h, auth)
	if r := ps["hello"].Restarts; r != 0 {
		t.Errorf("hello restarts after an unauthorized restart = %d, want 0", r)
	}

	t.Run("list", func(t *testing.T) {
		resp, body := mustRequest(t, http.MethodGet, h.admin+"/v1/plugins", nil, auth)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /v1/plugins = %d %s, want 200", resp.StatusCode, body)
		}
		var list []map[string]any
		if err := json.Unmarshal(body, &list); err != nil {
			t.Fatalf("decode /v1/plugins: %v: %s", err, body)
		}
		var names []string
		for _, p := range list {
			names = append(names, p["name"].(string))
			for _, k := range []string{"name", "state", "pid", "restarts", "version", "last_error"} {
				if _, ok := p[k]; !ok {
					t.Errorf("plugin %v has no %q field: %s", p["name"], k, body)
				}
			}
		}
		if want := []string{"faulty", "hello"}; !slices.Equal(names, want) {
			t.Errorf("GET /v1/plugins names = %q, want %q sorted", names, want)
		}
		hello := ps["hello"]
		if hello.State != "ready" || hello.Pid <= 0 || hello.Version != "0.1.0" || hello.LastError != "" {
			t.Errorf("hello = %+v, want ready with a pid, version 0.1.0 and no last_error", hello)
		}
		if !alive(hello.Pid) {
			t.Errorf("hello pid %d is not a live process", hello.Pid)
		}
		// An SDK plugin on Unix gets its requests over the data plane.
		if want := min(runtime.GOMAXPROCS(0), 16); runtime.GOOS != "windows" && hello.DataPlaneConns != want {
			t.Errorf("hello's data_plane_conns = %d, want %d (one per host CPU)", hello.DataPlaneConns, want)
		}
	})

	t.Run("restart", func(t *testing.T) {
		old := ps["hello"].Pid
		resp, body := mustRequest(t, http.MethodPost, h.admin+"/v1/plugins/hello/restart", nil, auth)
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("POST /v1/plugins/hello/restart = %d %s, want 202", resp.StatusCode, body)
		}
		var now pluginStatus
		waitFor(t, 15*time.Second, "hello to come back with a new pid", func() bool {
			now = adminPlugins(t, h, auth)["hello"]
			return now.State == "ready" && now.Pid != 0 && now.Pid != old
		})
		if now.Restarts != 1 {
			t.Errorf("hello restarts after one restart = %d, want 1", now.Restarts)
		}
		if !waitGone(old, 5*time.Second) {
			t.Errorf("old hello process %d still alive 5s after the restart", old)
		}
		resp, body = mustRequest(t, http.MethodGet, h.ingress+"/hello/", nil, nil)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET /hello/ after the restart = %d %s, want 200", resp.StatusCode, body)
		}
		if f := adminPlugins(t, h, auth)["faulty"]; f.Pid != ps["faulty"].Pid || f.Restarts != 0 {
			t.Errorf("faulty after restarting hello = %+v, want it untouched (pid %d)", f, ps["faulty"].Pid)
		}
	})

	t.Run("errors", func(t *testing.T) {
		tests := []struct {
			name, method, path string
			want               int
			code               string
		}{
			{"restart an unknown plugin", "POST", "/v1/plugins/nosuch/restart", http.StatusNotFound, "not_found"},
			{"unknown endpoint", "GET", "/v1/nosuch", http.StatusNotFound, "not_found"},
			{"GET a restart", "GET", "/v1/plugins/hello/restart", http.StatusMethodNotAllowed, "method_not_allowed"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				resp, body := mustRequest(t, tt.method, h.admin+tt.path, nil, auth)
				checkJSONError(t, tt.method+" "+tt.path, resp, body, tt.want, tt.code)
			})
		}
	})
}

func TestMetricsExposition(t *testing.T) {
	// A short drain deadline so that restarting hello under a long request
	// aborts it and plughost_drain_aborted_total gets a series.
	h := startHost(t, baseConfig("500ms")+pluginBlock("hello", "hello", "  max_inflight = 1")+pluginBlock("faulty", "faulty", ""))

	for _, path := range []string{"/hello/", "/hello/sleep?ms=1", "/hello/nosuch", "/faulty/ok", "/faulty/panic"} {
		_, _ = h.get(h.ingress + path)
	}
	// One long request holds hello's only slot: the next is refused (busy),
	// and a restart with the 500ms drain deadline abandons it.
	type result struct {
		resp *http.Response
		body []byte
		err  error
	}
	sleeps, _ := h.metric(`hello_sleeps_total{plugin="hello"}`)
	long := make(chan result, 1)
	go func() {
		resp, body, err := request(t, http.MethodGet, h.ingress+"/hello/sleep?ms=20000", nil, nil)
		long <- result{resp, body, err}
	}()
	waitFor(t, 10*time.Second, "the long request in flight", func() bool {
		v, ok := h.metric(`plughost_inflight_requests{plugin="hello"}`)
		// At the plugin too, so the restart's drain cannot overtake it.
		started, _ := h.metric(`hello_sleeps_total{plugin="hello"}`)
		return ok && v == 1 && started == sleeps+1
	})
	resp, body := mustRequest(t, http.MethodGet, h.ingress+"/hello/", nil, nil)
	checkJSONError(t, "GET /hello/ while the slot is taken", resp, body, http.StatusTooManyRequests, "busy")
	old := h.plugins()["hello"].Pid
	if code, body := do(t, http.MethodPost, h.admin+"/v1/plugins/hello/restart", nil, nil); code != http.StatusAccepted {
		t.Fatalf("POST /v1/plugins/hello/restart = %d %s, want 202", code, body)
	}
	select {
	case r := <-long:
		if r.err != nil {
			t.Fatalf("long request: %v", r.err)
		}
		checkJSONError(t, "long request cut by the drain deadline", r.resp, r.body, http.StatusServiceUnavailable, "drain_aborted")
	case <-time.After(15 * time.Second):
		t.Fatal("long request not answered 15s after the restart with a 500ms drain deadline")
	}
	waitFor(t, 15*time.Second, "hello to come back", func() bool {
		p := h.plugins()["hello"]
		return p.State == "ready" && p.Pid != old
	})
	if code, body := h.get(h.ingress + "/hello/sleep?ms=1"); code != http.StatusOK {
		t.Fatalf("GET /hello/sleep?ms=1 after the restart = %d %s, want 200", code, body)
	}

	resp, body = mustRequest(t, http.MethodGet, h.admin+"/metrics", nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics = %d, want 200", resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	problems, err := promlint.New(strings.NewReader(string(body))).Lint()
	if err != nil {
		t.Fatalf("promlint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}

	// Every family must hold a series labelled with these label values.
	tests := []struct {
		family string
		typ    dto.MetricType
		labels map[string]string
	}{
		{"plughost_plugin_up", dto.MetricType_GAUGE, map[string]string{"plugin": "hello"}},
		{"plughost_plugin_up", dto.MetricType_GAUGE, map[string]string{"plugin": "faulty"}},
		{"plughost_plugin_state", dto.MetricType_GAUGE, map[string]string{"plugin": "hello", "state": "ready"}},
		{"plughost_plugin_restarts_total", dto.MetricType_COUNTER, map[string]string{"plugin": "hello", "reason": "failure"}},
		{"plughost_plugin_restarts_total", dto.MetricType_COUNTER, map[string]string{"plugin": "hello", "reason": "operator"}},
		{"plughost_plugin_restarts_total", dto.MetricType_COUNTER, map[string]string{"plugin": "hello", "reason": "upgrade"}},
		{"plughost_http_requests_total", dto.MetricType_COUNTER, map[string]string{"plugin": "hello", "code": "200"}},
		{"plughost_http_requests_total", dto.MetricType_COUNTER, map[string]string{"plugin": "hello", "code": "404"}},
		{"plughost_http_requests_total", dto.MetricType_COUNTER, map[string]string{"plugin": "hello", "code": "429"}},
		{"plughost_http_requests_total", dto.MetricType_COUNTER, map[string]string{"plugin": "faulty", "code": "500"}},
		{"plughost_http_request_duration_seconds", dto.MetricType_HISTOGRAM, map[string]string{"plugin": "hello"}},
		{"plughost_inflight_requests", dto.MetricType_GAUGE, map[string]string{"plugin": "hello"}},
		{"plughost_busy_rejections_total", dto.MetricType_COUNTER, map[string]string{"plugin": "hello"}},
		{"plughost_drain_aborted_total", dto.MetricType_COUNTER, map[string]string{"plugin": "hello"}},
		{"hello_sleeps_total", dto.MetricType_COUNTER, map[string]string{"plugin": "hello"}},
	}
	for _, tt := range tests {
		mf, ok := fams[tt.family]
		if !ok {
			t.Errorf("/metrics has no family %s", tt.family)
			continue
		}
		if mf.GetType() != tt.typ {
			t.Errorf("%s type = %v, want %v", tt.family, mf.GetType(), tt.typ)
		}
		if !slices.ContainsFunc(mf.GetMetric(), func(m *dto.Metric) bool { return hasLabels(m, tt.labels) }) {
			t.Errorf("%s has no series with labels %v", tt.family, tt.labels)
		}
	}

	value := func(family string, labels map[string]string) float64 {
		for _, m := range fams[family].GetMetric() {
			if hasLabels(m, labels) {
				switch {
				case m.GetCounter() != nil:
					return m.GetCounter().GetValue()
				case m.GetGauge() != nil:
					return m.GetGauge().GetValue()
				}
			}
		}
		return -1
	}
	hello := map[string]string{"plugin": "hello"}
	checks := []struct {
		family string
		labels map[string]string
		want   float64
	}{
		{"plughost_plugin_up", hello, 1},
		// An operator's restart, which alerts on failures do not count.
		{"plughost_plugin_restarts_total", map[string]string{"plugin": "hello", "reason": "operator"}, 1},
		{"plughost_plugin_restarts_total", map[string]string{"plugin": "hello", "reason": "failure"}, 0},
		{"plughost_busy_rejections_total", hello, 1},
		{"plughost_drain_aborted_total", hello, 1},
		{"plughost_inflight_requests", hello, 0},
		// The restarted process counts from zero: one sleep since.
		{"hello_sleeps_total", hello, 1},
	}
	for _, c := range checks {
		if got := value(c.family, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.family, c.labels, got, c.want)
		}
	}
}

// hasLabels reports whether m carries every label in want.
func hasLabels(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := want[lp.GetName()]; ok && v == lp.GetValue() {
			n++
		}
	}
	return n == len(want)
}
