package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
	"github.com/plughost/plughost/sdk"
)

func TestGreet(t *testing.T) {
	tests := []struct {
		name   string
		config string
		want   string
	}{
		{"default", "", "hello"},
		{"configured", `greeting = "bonjour"`, "bonjour"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := plugintest.New(t, definition(), plugintest.Options{Config: tt.config})
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			var got struct{ Greeting string }
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || rec.Code != http.StatusOK {
				t.Fatalf("GET / = %d %q, want 200 with JSON", rec.Code, rec.Body)
			}
			if got.Greeting != tt.want {
				t.Errorf("greeting = %q, want %q", got.Greeting, tt.want)
			}
		})
	}
}

func TestConfigRejected(t *testing.T) {
	_, err := plugintest.Start(t, definition(), plugintest.Options{Config: `greeting = ""`})
	var ce *sdk.ConfigError
	if !errors.As(err, &ce) || ce.Attribute != "greeting" {
		t.Fatalf("Start(greeting = \"\") = %v, want a ConfigError about greeting", err)
	}
	_, err = plugintest.Start(t, definition(), plugintest.Options{Config: `greting = "typo"`})
	if err == nil || !strings.Contains(err.Error(), "greting") {
		t.Fatalf("Start(greting = ...) = %v, want a schema error naming the unknown attribute", err)
	}
}

func TestSleep(t *testing.T) {
	h := plugintest.New(t, definition(), plugintest.Options{})
	tests := []struct {
		query string
		code  int
	}{
		{"ms=1", http.StatusOK},
		{"ms=0", http.StatusOK},
		{"ms=-1", http.StatusBadRequest},
		{"ms=abc", http.StatusBadRequest},
		{"", http.StatusBadRequest},
		{"ms=600001", http.StatusBadRequest},
		{"ms=9223372036855", http.StatusBadRequest},
	}
	for _, tt := range tests {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/sleep?"+tt.query, nil))
		if rec.Code != tt.code {
			t.Errorf("GET /sleep?%s = %d %s, want %d", tt.query, rec.Code, rec.Body, tt.code)
		}
	}
}

func TestSleepCancelled(t *testing.T) {
	h := plugintest.New(t, definition(), plugintest.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/sleep?ms=60000", nil).WithContext(ctx))
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("a cancelled /sleep?ms=60000 took %v; it must end when the request is cancelled", d)
	}
}

func TestSleepMetric(t *testing.T) {
	h := plugintest.New(t, definition(), plugintest.Options{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/sleep?ms=1", nil))
	m, err := h.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m, "hello_sleeps_total 1") {
		t.Errorf("metrics = %q, want hello_sleeps_total 1", m)
	}
}
