package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
	"github.com/plughost/plughost/sdk"
)

// call sends one request through h and returns the status and the body.
func call(t *testing.T, h http.Handler, method, path, body string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// errorCode returns the code of a JSON error body, or "" if it is none.
func errorCode(body string) string {
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal([]byte(body), &e)
	return e.Error.Code
}

func TestGreet(t *testing.T) {
	tests := []struct {
		name   string
		config string
		path   string
		code   int
		want   string // the greeting, or the error code
	}{
		{"root, default greeting", ``, "/", 200, "hello"},
		{"root, configured greeting", `greeting = "bonjour"`, "/", 200, "bonjour"},
		{"a name", ``, "/greet/ada", 200, "hello, ada"},
		{"a name, configured greeting", `greeting = "hi"`, "/greet/ada", 200, "hi, ada"},
		{"an escaped name", ``, "/greet/Ada%20Lovelace", 200, "hello, Ada Lovelace"},
		{"a name at max_name_len", `max_name_len = 3`, "/greet/Zoë", 200, "hello, Zoë"},
		{"a name over max_name_len", `max_name_len = 3`, "/greet/ada2", 400, "bad_request"},
		{"a control character", ``, "/greet/a%00b", 400, "bad_request"},
		{"a blank name", ``, "/greet/%20", 400, "bad_request"},
		{"no name", ``, "/greet/", 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := plugintest.New(t, definition(), plugintest.Options{Config: tt.config})
			code, body := call(t, h, http.MethodGet, tt.path, "")
			if code != tt.code {
				t.Fatalf("GET %s = %d %s, want %d", tt.path, code, body, tt.code)
			}
			if code == http.StatusNotFound {
				return // the harness's own 404, like the host's
			}
			got := errorCode(body)
			if code == http.StatusOK {
				var g greeting
				if err := json.Unmarshal([]byte(body), &g); err != nil {
					t.Fatalf("GET %s = %s, want a JSON greeting: %v", tt.path, body, err)
				}
				got = g.Greeting
			}
			if got != tt.want {
				t.Errorf("GET %s = %s, want %q", tt.path, body, tt.want)
			}
		})
	}
}

func TestSetGreeting(t *testing.T) {
	long := `{"name": "ada", "greeting": "` + strings.Repeat("x", maxBodyBytes) + `"}`
	tests := []struct {
		name        string
		contentType string
		body        string
		code        int
		errCode     string
	}{
		{"a new name", "application/json", `{"name": "ada", "greeting": "ahoy"}`, 201, ""},
		{"with a charset", "application/json; charset=utf-8", `{"name": "ada", "greeting": "ahoy"}`, 201, ""},
		{"no content type", "", `{"name": "ada", "greeting": "ahoy"}`, 415, "unsupported_media_type"},
		{"text", "text/plain", `{"name": "ada", "greeting": "ahoy"}`, 415, "unsupported_media_type"},
		{"an unknown field", "application/json", `{"name": "ada", "greeting": "ahoy", "extra": 1}`, 400, "bad_request"},
		{"truncated JSON", "application/json", `{"name": "ada", "greeting": "ah`, 400, "bad_request"},
		{"two objects", "application/json", `{"name": "ada", "greeting": "ahoy"} {}`, 400, "bad_request"},
		{"trailing junk", "application/json", `{"name": "ada", "greeting": "ahoy"}]`, 400, "bad_request"},
		{"an array", "application/json", `[{"name": "ada", "greeting": "ahoy"}]`, 400, "bad_request"},
		{"null", "application/json", `null`, 400, "bad_request"},
		{"a number for a name", "application/json", `{"name": 7, "greeting": "ahoy"}`, 400, "bad_request"},
		{"no greeting", "application/json", `{"name": "ada"}`, 400, "bad_request"},
		{"a blank greeting", "application/json", `{"name": "ada", "greeting": "  "}`, 400, "bad_request"},
		{"a greeting too long", "application/json", `{"name": "ada", "greeting": "` + strings.Repeat("é", maxGreetingLen+1) + `"}`, 400, "bad_request"},
		{"a name too long", "application/json", `{"name": "` + strings.Repeat("a", 65) + `", "greeting": "ahoy"}`, 400, "bad_request"},
		{"a control character", "application/json", `{"name": "ada", "greeting": "a\u0007"}`, 400, "bad_request"},
		{"invalid UTF-8", "application/json", "{\"name\": \"ad\xff\", \"greeting\": \"ahoy\"}", 400, "bad_request"},
		{"a body too large", "application/json", long, 413, "body_too_large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := plugintest.New(t, definition(), plugintest.Options{})
			req := httptest.NewRequest(http.MethodPost, "/greetings", strings.NewReader(tt.body))
			if tt.contentType != "" {
				req.Header.Set("Content-Type", tt.contentType)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.code || errorCode(rec.Body.String()) != tt.errCode {
				t.Fatalf("POST /greetings %s = %d %s, want %d %q", tt.body, rec.Code, rec.Body, tt.code, tt.errCode)
			}
			if tt.code >= 400 {
				if code, body := call(t, h, http.MethodGet, "/greet/ada", ""); !strings.Contains(body, `"hello, ada"`) {
					t.Errorf("GET /greet/ada after a refused POST = %d %s, want the configured greeting", code, body)
				}
			}
		})
	}
}

func TestCustomGreeting(t *testing.T) {
	h := plugintest.New(t, definition(), plugintest.Options{Config: `cooldown = "0s"`})
	steps := []struct {
		method, path, body string
		code               int
		want               string
	}{
		{"GET", "/greet/ada", "", 200, `{"greeting":"hello, ada"}`},
		{"POST", "/greetings", `{"name": "ada", "greeting": "ahoy"}`, 201, `{"name":"ada","greeting":"ahoy"}`},
		{"GET", "/greet/ada", "", 200, `{"greeting":"ahoy, ada"}`},
		{"GET", "/greet/bob", "", 200, `{"greeting":"hello, bob"}`},
		{"POST", "/greetings", `{"name": "ada", "greeting": "hej"}`, 200, `{"name":"ada","greeting":"hej"}`},
		{"GET", "/greet/ada", "", 200, `{"greeting":"hej, ada"}`},
	}
	for _, s := range steps {
		code, body := call(t, h, s.method, s.path, s.body)
		if code != s.code || strings.TrimSpace(body) != s.want {
			t.Fatalf("%s %s %s = %d %s, want %d %s", s.method, s.path, s.body, code, body, s.code, s.want)
		}
	}
}

func TestCooldown(t *testing.T) {
	h := plugintest.New(t, definition(), plugintest.Options{Config: `cooldown = "1h"`})
	if code, body := call(t, h, "POST", "/greetings", `{"name": "ada", "greeting": "ahoy"}`); code != http.StatusCreated {
		t.Fatalf("first POST = %d %s, want 201", code, body)
	}
	// Other names are not held back by ada's cooldown.
	if code, body := call(t, h, "POST", "/greetings", `{"name": "bob", "greeting": "ahoy"}`); code != http.StatusCreated {
		t.Fatalf("POST for another name = %d %s, want 201", code, body)
	}
	req := httptest.NewRequest("POST", "/greetings", strings.NewReader(`{"name": "ada", "greeting": "hej"}`))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusTooManyRequests || errorCode(rec.Body.String()) != "cooldown" {
		t.Fatalf("second POST within the cooldown = %d %s, want 429 cooldown", rec.Code, rec.Body)
	}
	if s, err := strconv.Atoi(rec.Header().Get("Retry-After")); err != nil || s < 3500 || s > 3600 {
		t.Errorf("Retry-After = %q, want about 3600 seconds", rec.Header().Get("Retry-After"))
	}
	if _, body := call(t, h, "GET", "/greet/ada", ""); !strings.Contains(body, `"ahoy, ada"`) {
		t.Errorf("GET /greet/ada after a refused change = %s, want the first greeting", body)
	}
}

func TestFullStore(t *testing.T) {
	h := plugintest.New(t, definition(), plugintest.Options{Config: "max_greetings = 1\ncooldown = \"0s\""})
	if got, err := h.Health(t.Context()); err != nil || got.Status != sdk.StatusReady {
		t.Fatalf("Health with an empty store = %+v, %v, want ready", got, err)
	}
	if code, body := call(t, h, "POST", "/greetings", `{"name": "ada", "greeting": "ahoy"}`); code != http.StatusCreated {
		t.Fatalf("POST ada = %d %s, want 201", code, body)
	}
	if code, body := call(t, h, "POST", "/greetings", `{"name": "bob", "greeting": "ahoy"}`); code != http.StatusInsufficientStorage || errorCode(body) != "full" {
		t.Errorf("POST bob into a full store = %d %s, want 507 full", code, body)
	}
	if code, body := call(t, h, "POST", "/greetings", `{"name": "ada", "greeting": "hej"}`); code != http.StatusOK {
		t.Errorf("POST ada again into a full store = %d %s, want 200: known names may change", code, body)
	}
	got, err := h.Health(t.Context())
	if err != nil || got.Status != sdk.StatusDegraded || !strings.Contains(got.Reason, "max_greetings") {
		t.Errorf("Health with a full store = %+v, %v, want degraded with a reason naming max_greetings", got, err)
	}
}

func TestSlow(t *testing.T) {
	h := plugintest.New(t, definition(), plugintest.Options{})
	tests := []struct {
		query string
		code  int
	}{
		{"ms=0", http.StatusOK},
		{"ms=5", http.StatusOK},
		{"ms=-1", http.StatusBadRequest},
		{"ms=abc", http.StatusBadRequest},
		{"", http.StatusBadRequest},
		{"ms=4001", http.StatusBadRequest},
		{"ms=99999999999999999999", http.StatusBadRequest},
	}
	for _, tt := range tests {
		if code, body := call(t, h, http.MethodGet, "/slow?"+tt.query, ""); code != tt.code {
			t.Errorf("GET /slow?%s = %d %s, want %d", tt.query, code, body, tt.code)
		}
	}
}

func TestConfigRefused(t *testing.T) {
	tests := []struct {
		config string
		attr   string // the attribute a Configure refusal names; "" for a schema error
	}{
		{`greeting = ""`, "greeting"},
		{`greeting = "a` + strings.Repeat("h", maxGreetingLen) + `"`, "greeting"},
		{`max_name_len = 0`, "max_name_len"},
		{`max_name_len = 2000`, "max_name_len"},
		{`max_greetings = 0`, "max_greetings"},
		{`cooldown = "-1s"`, "cooldown"},
		{`greting = "typo"`, ""},
		{`max_name_len = "many"`, ""},
		{`cooldown = "soon"`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.config, func(t *testing.T) {
			_, err := plugintest.Start(t, definition(), plugintest.Options{Config: tt.config})
			var ce *sdk.ConfigError
			switch {
			case err == nil:
				t.Fatalf("Start(%s) succeeded, want it refused", tt.config)
			case tt.attr == "" && errors.As(err, &ce):
				t.Fatalf("Start(%s) = %v, want a schema error before Configure runs", tt.config, err)
			case tt.attr != "" && (!errors.As(err, &ce) || ce.Attribute != tt.attr):
				t.Fatalf("Start(%s) = %v, want a ConfigError about %s", tt.config, err, tt.attr)
			}
		})
	}
}

func TestDrainSavesGreetings(t *testing.T) {
	dir := t.TempDir()
	h := plugintest.New(t, definition(), plugintest.Options{DataDir: dir})
	if code, body := call(t, h, "POST", "/greetings", `{"name": "ada", "greeting": "ahoy"}`); code != http.StatusCreated {
		t.Fatalf("POST = %d %s, want 201", code, body)
	}
	if _, _, err := h.Drain(t.Context(), time.Now().Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if code, body := call(t, h, "POST", "/greetings", `{"name": "bob", "greeting": "ahoy"}`); code != http.StatusServiceUnavailable {
		t.Errorf("POST after Drain = %d %s, want 503", code, body)
	}
	// The next process, in the same data directory, has ada's greeting.
	next := plugintest.New(t, definition(), plugintest.Options{DataDir: dir})
	if code, body := call(t, next, "GET", "/greet/ada", ""); code != http.StatusOK || !strings.Contains(body, `"ahoy, ada"`) {
		t.Errorf("GET /greet/ada after a drain and a new start = %d %s, want the saved greeting", code, body)
	}
}

func TestCorruptSaveRefused(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "greetings.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := plugintest.Start(t, definition(), plugintest.Options{DataDir: dir})
	var ce *sdk.ConfigError
	if !errors.As(err, &ce) || !strings.Contains(ce.Message, "greetings.json") {
		t.Fatalf("Start with a corrupt greetings.json = %v, want a refusal naming the file", err)
	}
}

func TestMetrics(t *testing.T) {
	h := plugintest.New(t, definition(), plugintest.Options{Config: `cooldown = "0s"`})
	call(t, h, "GET", "/", "")
	call(t, h, "GET", "/greet/ada", "")
	call(t, h, "POST", "/greetings", `{"name": "bob", "greeting": "ahoy"}`)
	call(t, h, "GET", "/greet/bob", "")
	call(t, h, "GET", "/greet/bob", "")
	m, err := h.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`greeter_greetings_total{kind="plain"} 1`,
		`greeter_greetings_total{kind="named"} 1`,
		`greeter_greetings_total{kind="custom"} 2`,
		`greeter_custom_greetings 1`,
	} {
		if !strings.Contains(m, want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, m)
		}
	}
}

// FuzzParseCustomGreeting checks that no body crashes the decoder and that
// whatever it accepts is a valid name and greeting.
func FuzzParseCustomGreeting(f *testing.F) {
	for _, seed := range []string{
		`{"name": "ada", "greeting": "ahoy"}`,
		`{"name": "ada", "greeting": "ahoy", "x": 1}`,
		`{"name": "", "greeting": ""}`,
		`[1, 2`,
		"{\"name\": \"\xff\", \"greeting\": \"\u0000\"}",
		`{"name": "a"} {"name": "b"}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		cg, err := parseCustomGreeting("application/json", strings.NewReader(body), 64)
		if err != nil {
			return
		}
		if checkName(cg.Name, 64) != nil || checkGreeting(cg.Greeting) != nil {
			t.Errorf("parseCustomGreeting(%q) accepted %+v", body, cg)
		}
	})
}
