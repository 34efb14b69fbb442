package e2e

import (
	"bufio"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v2"
)

const (
	dashboardPath = "../../docs/deploy/grafana-dashboard.json"
	alertsPath    = "../../docs/deploy/alerts.yml"
)

// prometheusMade holds the series Prometheus writes itself for every
// scrape target, which no /metrics exports.
var prometheusMade = map[string]bool{"up": true}

// exportedNames returns the metric names an exposition body offers to
// queries: every sample's name, and for each histogram or summary family
// the series names its samples may take (_bucket, _sum, _count), so that
// a family counts even before its first observation.
func exportedNames(body string) map[string]bool {
	out := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			f := strings.Fields(rest)
			if len(f) != 2 {
				continue
			}
			out[f[0]] = true
			switch f[1] {
			case "histogram":
				out[f[0]+"_bucket"], out[f[0]+"_sum"], out[f[0]+"_count"] = true, true, true
			case "summary":
				out[f[0]+"_sum"], out[f[0]+"_count"] = true, true
			}
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			out[line[:i]] = true
		}
	}
	return out
}

// dashboardExprs returns the PromQL of a Grafana dashboard: every
// panel's (and nested panel's) target expressions and every query
// variable's query, keyed by where each is; and the targets' legend
// formats under the same keys.
func dashboardExprs(t *testing.T, dash map[string]any) (exprs, legends map[string]string) {
	t.Helper()
	out := map[string]string{}
	legends = map[string]string{}
	var panels func(list []any, where string)
	panels = func(list []any, where string) {
		for _, p := range list {
			pm, _ := p.(map[string]any)
			title, _ := pm["title"].(string)
			w := where + "panel " + title
			if ds, ok := pm["datasource"].(map[string]any); ok && ds["uid"] != "${datasource}" {
				t.Errorf("%s: datasource %v, want the ${datasource} variable", w, ds)
			}
			targets, _ := pm["targets"].([]any)
			for _, tg := range targets {
				tm, _ := tg.(map[string]any)
				expr, _ := tm["expr"].(string)
				if expr == "" {
					t.Errorf("%s: target %v has no expr", w, tm["refId"])
					continue
				}
				out[w+" target "+tm["refId"].(string)] = expr
				legends[w+" target "+tm["refId"].(string)], _ = tm["legendFormat"].(string)
			}
			if nested, ok := pm["panels"].([]any); ok {
				panels(nested, w+" > ")
			}
		}
	}
	list, _ := dash["panels"].([]any)
	panels(list, "")
	templ, _ := dash["templating"].(map[string]any)
	vars, _ := templ["list"].([]any)
	for _, v := range vars {
		vm, _ := v.(map[string]any)
		if vm["type"] != "query" {
			continue
		}
		q, _ := vm["query"].(string)
		if qm, ok := vm["query"].(map[string]any); ok {
			q, _ = qm["query"].(string)
		}
		if expr := templatingExpr(q); expr != "" {
			out["variable "+vm["name"].(string)] = expr
		}
	}
	return out, legends
}

var (
	groupingRE   = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	legendRE     = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)
	seriesLineRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} `)
	labelPairRE  = regexp.MustCompile(`([a-zA-Z_]\w*)="(?:[^"\\]|\\.)*"`)
)

// seriesLabels returns, for each metric name in an exposition body, the
// label names its series carry.
func seriesLabels(body string) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for line := range strings.Lines(body) {
		m := seriesLineRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if out[m[1]] == nil {
			out[m[1]] = map[string]bool{}
		}
		for _, lp := range labelPairRE.FindAllStringSubmatch(m[2], -1) {
			out[m[1]][lp[1]] = true
		}
	}
	return out
}

// usedLabels returns the label names an expression groups by and its
// legend prints: each must be on the series it reads, or the panel
// merges what it means to split and prints an empty legend.
func usedLabels(expr, legend string) []string {
	var out []string
	for _, m := range groupingRE.FindAllStringSubmatch(expr, -1) {
		for l := range strings.SplitSeq(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
	}
	for _, m := range legendRE.FindAllStringSubmatch(legend, -1) {
		out = append(out, m[1])
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// alertExprs returns the expressions of a Prometheus rule file, keyed by
// alert or record name.
func alertExprs(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert  string `yaml:"alert"`
				Record string `yaml:"record"`
				Expr   string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	out := map[string]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out["alert "+r.Alert+r.Record] = r.Expr
		}
	}
	return out
}

// shippedPluginsConfig returns a host config that runs every plugin in
// plugins/, each configured as its e2e tests and docs show, the gateway
// in front of web and the wallet.
func shippedPluginsConfig(t *testing.T, webURL string) string {
	t.Helper()
	shipped, err := os.ReadDir("../../plugins")
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string]string{
		"hello":    helloWith("hi"),
		"wallet":   walletBlock(""),
		"mailbox":  pluginBlock("mailbox", "mailbox", ""),
		"registry": regConfig(),
		"rewarder": pluginBlock("rewarder", "rewarder", ""),
		"gateway":  gatewayBlock(webURL, ""),
	}
	cfg := baseConfig("2s")
	for _, e := range shipped {
		if !e.IsDir() {
			continue
		}
		b, ok := blocks[e.Name()]
		if !ok {
			t.Fatalf("plugins/%s is shipped but this test does not configure it: add its block", e.Name())
		}
		cfg += b
	}
	return cfg
}

// TestDashboardAndAlertsNameExportedMetrics starts a host with every
// shipped plugin, sends a request so that the per-status request counter
// has a series, and scrapes its admin /metrics. Every metric name in the
// Grafana dashboard's expressions and variables and in the alert rules
// must be one that scrape offers, and every __name__ regex must match at
// least one; a dashboard panel on a metric nobody exports draws nothing
// and an alert on one never fires, silently.
func TestDashboardAndAlertsNameExportedMetrics(t *testing.T) {
	dash := readDashboard(t)
	if dash["uid"] != "plughost" || dash["title"] == "" {
		t.Errorf("%s: uid %v title %v, want uid plughost and a title", dashboardPath, dash["uid"], dash["title"])
	}
	exprs, legends := dashboardExprs(t, dash)
	vars := map[string]bool{}
	templ, _ := dash["templating"].(map[string]any)
	list, _ := templ["list"].([]any)
	for _, v := range list {
		vm, _ := v.(map[string]any)
		if vm["name"] == "datasource" && (vm["type"] != "datasource" || vm["query"] != "prometheus") {
			t.Errorf("%s: variable datasource is %v %v, want a prometheus datasource variable", dashboardPath, vm["type"], vm["query"])
		}
		vars[vm["name"].(string)] = true
	}
	for _, name := range []string{"datasource", "instance", "plugin"} {
		if !vars[name] {
			t.Errorf("%s: no %s variable", dashboardPath, name)
		}
	}
	alerts := alertExprs(t, alertsPath)
	if len(exprs) < 20 || len(alerts) < 5 {
		t.Fatalf("%d dashboard expressions and %d alert rules found: the test reads them wrong", len(exprs), len(alerts))
	}

	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(web.Close)
	h := startHost(t, shippedPluginsConfig(t, web.URL))
	for name := range h.plugins() {
		readyPlugin(t, h, name)
	}
	if code, body := h.greeting(); code != http.StatusOK {
		t.Fatalf("GET /hello/ = %d %s", code, body)
	}
	// Some plugin gauges are set by their first health check, after the
	// plugin is ready: scrape until every name used is there, or give up
	// after a while and report what is missing.
	var used []string
	for _, exprs := range []map[string]string{exprs, alerts} {
		for _, expr := range exprs {
			names, _, _ := metricNames(expr)
			used = append(used, names...)
		}
	}
	var exported map[string]bool
	var body string
	deadline := time.Now().Add(15 * time.Second)
	for {
		var code int
		code, body = h.get(h.admin + "/metrics")
		if code != http.StatusOK {
			t.Fatalf("GET /metrics = %d", code)
		}
		exported = exportedNames(body)
		if time.Now().After(deadline) || !slices.ContainsFunc(used, func(n string) bool { return !exported[n] }) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	var all []string
	for n := range exported {
		all = append(all, n)
	}
	slices.Sort(all)

	check := func(file string, exprs map[string]string) {
		for where, expr := range exprs {
			names, regexes, bad := metricNames(expr)
			if len(names)+len(regexes) == 0 {
				t.Errorf("%s: %s: %q names no metric", file, where, expr)
			}
			for _, b := range bad {
				t.Errorf("%s: %s: %s selects by what a name is not; name the metrics", file, where, b)
			}
			for _, n := range names {
				if !exported[n] && !prometheusMade[n] {
					t.Errorf("%s: %s: %s is not exported by the host or a shipped plugin", file, where, n)
				}
			}
			for _, r := range regexes {
				re, err := regexp.Compile("^(?:" + r + ")$")
				if err != nil {
					t.Errorf("%s: %s: __name__=~%q: %v", file, where, r, err)
					continue
				}
				if !slices.ContainsFunc(all, re.MatchString) {
					t.Errorf("%s: %s: __name__=~%q matches no exported metric", file, where, r)
				}
			}
		}
	}
	check(dashboardPath, exprs)
	check(alertsPath, alerts)

	// The labels a panel groups by or prints must be on the series it
	// reads (instance and job come from Prometheus). A metric with no
	// series in this scrape cannot vouch either way.
	labels := seriesLabels(body)
	for where, expr := range exprs {
		names, regexes, _ := metricNames(expr)
		have := map[string]bool{"instance": true, "job": true}
		seen := false
		for n, ls := range labels {
			match := slices.Contains(names, n)
			for _, r := range regexes {
				if ok, _ := regexp.MatchString("^(?:"+r+")$", n); ok {
					match = true
				}
			}
			if match {
				seen = true
				maps.Copy(have, ls)
			}
		}
		if !seen {
			continue
		}
		for _, l := range usedLabels(expr, legends[where]) {
			if !have[l] {
				t.Errorf("%s: %s: label %q (by or {{%s}}) is on no series of %v %v", dashboardPath, where, l, l, names, regexes)
			}
		}
	}

	// Every plugin with an sdk/durable committer (a store breaker)
	// exports its store's corruption count under the one name the
	// corruption alert selects, and every plugin has its health.
	breaker := regexp.MustCompile(`(?m)^[a-z_]+_breaker_state\{plugin="([^"]+)"\}`)
	stateful := breaker.FindAllStringSubmatch(body, -1)
	if len(stateful) < 4 {
		t.Errorf("/metrics has %d store breakers, want one for each of wallet, mailbox, rewarder and registry", len(stateful))
	}
	for _, m := range stateful {
		if _, ok := parseMetric(body, `store_corruption_total{plugin="`+m[1]+`"}`); !ok {
			t.Errorf("%s has a store breaker but no store_corruption_total: corruption it meets is invisible", m[1])
		}
	}
	for name := range h.plugins() {
		if v, ok := parseMetric(body, `plughost_plugin_health{plugin="`+name+`",status="ready"}`); !ok || v != 1 {
			t.Errorf(`plughost_plugin_health{plugin=%q,status="ready"} = %v (found %v), want 1`, name, v, ok)
		}
	}
}

// readDashboard returns the shipped Grafana dashboard, decoded.
func readDashboard(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return dash
}

// findPanel returns the panel titled title, searching rows' nested
// panels too, or nil.
func findPanel(list []any, title string) map[string]any {
	for _, p := range list {
		pm, _ := p.(map[string]any)
		if pm["title"] == title {
			return pm
		}
		if nested, ok := pm["panels"].([]any); ok {
			if f := findPanel(nested, title); f != nil {
				return f
			}
		}
	}
	return nil
}

// TestDashboardReadyPanelNoData checks that the Ready stat says NOT READY
// when a host is down: its query counts a target Prometheus cannot
// scrape (up 0) as not ready, and no data at all, or a null, reads NOT
// READY rather than Grafana's neutral "No data".
func TestDashboardReadyPanelNoData(t *testing.T) {
	dash := readDashboard(t)
	list, _ := dash["panels"].([]any)
	p := findPanel(list, "Ready")
	if p == nil {
		t.Fatalf("%s: no panel Ready", dashboardPath)
	}
	var cfg struct {
		FieldConfig struct {
			Defaults struct {
				NoValue  string `json:"noValue"`
				Mappings []struct {
					Type    string         `json:"type"`
					Options map[string]any `json:"options"`
				} `json:"mappings"`
			} `json:"defaults"`
		} `json:"fieldConfig"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	}
	raw, _ := json.Marshal(p)
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	d := cfg.FieldConfig.Defaults
	if d.NoValue != "NOT READY" {
		t.Errorf("Ready: noValue %q, want %q", d.NoValue, "NOT READY")
	}
	var zero, null bool
	for _, m := range d.Mappings {
		switch m.Type {
		case "value":
			r, _ := m.Options["0"].(map[string]any)
			zero = r["text"] == "NOT READY"
		case "special":
			r, _ := m.Options["result"].(map[string]any)
			null = m.Options["match"] == "null+nan" && r["text"] == "NOT READY"
		}
	}
	if !zero || !null {
		t.Errorf("Ready: mappings %+v: 0 maps to NOT READY %v, null+nan maps to NOT READY %v; want both", d.Mappings, zero, null)
	}
	if len(cfg.Targets) != 1 || !strings.Contains(cfg.Targets[0].Expr, "up{") {
		t.Errorf("Ready: targets %+v, want one that counts an unscraped host (up == 0) as not ready", cfg.Targets)
	}
}

// TestDashboardCountsAndUnits pins what some panels count, where a query
// that draws would still draw the wrong thing: group commits counted
// once each (<prefix>_commit_seconds counts every attempt, retries
// included), the gateway's tenants kept apart, and bytes never on the
// axis of counts.
func TestDashboardCountsAndUnits(t *testing.T) {
	dash := readDashboard(t)
	list, _ := dash["panels"].([]any)
	exprs, _ := dashboardExprs(t, dash)
	tests := []struct {
		where, want string
	}{
		{"panel Commits/s target A", "_commit_batch_size_count"},
		{"panel Gateway target A", "by (plugin, tenant, outcome)"},
		{"panel Plugins' own refusals target C", "by (plugin, svc)"},
	}
	for _, tt := range tests {
		var got string
		for where, expr := range exprs {
			if strings.HasSuffix(where, tt.where) {
				got = expr
			}
		}
		if !strings.Contains(got, tt.want) {
			t.Errorf("%s: %q, want it to contain %q", tt.where, got, tt.want)
		}
	}
	for where, expr := range exprs {
		if strings.Contains(expr, "_commit_seconds_count") {
			t.Errorf("%s: %q counts commit attempts (retries included); count group commits with _commit_batch_size_count", where, expr)
		}
	}

	// A panel that draws a _bytes metric beside others gives the bytes
	// targets their unit by an override; one that draws only bytes has
	// it as its default.
	var walk func([]any)
	walk = func(ps []any) {
		for _, p := range ps {
			pm, _ := p.(map[string]any)
			if nested, ok := pm["panels"].([]any); ok {
				walk(nested)
			}
			var cfg struct {
				Title       string `json:"title"`
				FieldConfig struct {
					Defaults struct {
						Unit string `json:"unit"`
					} `json:"defaults"`
					Overrides []struct {
						Matcher struct {
							ID      string `json:"id"`
							Options string `json:"options"`
						} `json:"matcher"`
						Properties []struct {
							ID    string `json:"id"`
							Value any    `json:"value"`
						} `json:"properties"`
					} `json:"overrides"`
				} `json:"fieldConfig"`
				Targets []struct {
					RefID string `json:"refId"`
					Expr  string `json:"expr"`
				} `json:"targets"`
			}
			raw, _ := json.Marshal(pm)
			if err := json.Unmarshal(raw, &cfg); err != nil {
				t.Fatal(err)
			}
			bytesUnit := map[string]bool{}
			for _, o := range cfg.FieldConfig.Overrides {
				for _, pr := range o.Properties {
					if o.Matcher.ID == "byFrameRefID" && pr.ID == "unit" && pr.Value == "bytes" {
						bytesUnit[o.Matcher.Options] = true
					}
				}
			}
			var bytesRefs, others []string
			for _, tg := range cfg.Targets {
				if strings.Contains(tg.Expr, "_bytes") {
					bytesRefs = append(bytesRefs, tg.RefID)
				} else {
					others = append(others, tg.RefID)
				}
			}
			if len(bytesRefs) == 0 || len(others) == 0 && cfg.FieldConfig.Defaults.Unit == "bytes" {
				continue
			}
			for _, ref := range bytesRefs {
				if !bytesUnit[ref] {
					t.Errorf("panel %s: target %s draws bytes beside counts (%v) with no override giving it unit bytes", cfg.Title, ref, others)
				}
			}
		}
	}
	walk(list)
}
