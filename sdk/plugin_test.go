package sdk

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestDurationUnmarshalJSON(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{`"5s"`, 5 * time.Second, false},
		{`"250ms"`, 250 * time.Millisecond, false},
		{`"1h2m3s"`, time.Hour + 2*time.Minute + 3*time.Second, false},
		{`"0s"`, 0, false},
		{`"-1m"`, -time.Minute, false},
		{`"5"`, 0, true},
		{`""`, 0, true},
		{`"five seconds"`, 0, true},
		{`5`, 0, true},
		{`null`, 0, false}, // null leaves the value unchanged
		{`true`, 0, true},
	}
	for _, tt := range tests {
		var d Duration
		err := json.Unmarshal([]byte(tt.in), &d)
		if gotErr := err != nil; gotErr != tt.wantErr {
			t.Errorf("json.Unmarshal(%q, &Duration) error = %v, want error %t", tt.in, err, tt.wantErr)
			continue
		}
		if err == nil && d.Std() != tt.want {
			t.Errorf("json.Unmarshal(%q, &Duration) = %v, want %v", tt.in, d.Std(), tt.want)
		}
	}
}

func TestDurationMarshalJSON(t *testing.T) {
	tests := []struct {
		in   time.Duration
		want string
	}{
		{5 * time.Second, `"5s"`},
		{1500 * time.Millisecond, `"1.5s"`},
		{0, `"0s"`},
		{time.Hour, `"1h0m0s"`},
	}
	for _, tt := range tests {
		b, err := json.Marshal(Duration(tt.in))
		if err != nil || string(b) != tt.want {
			t.Errorf("json.Marshal(Duration(%v)) = %s, %v, want %s, nil", tt.in, b, err, tt.want)
			continue
		}
		var back Duration
		if err := json.Unmarshal(b, &back); err != nil || back.Std() != tt.in {
			t.Errorf("json.Unmarshal(%s) = %v, %v, want %v, nil", b, back.Std(), err, tt.in)
		}
	}
}

func TestDurationInStruct(t *testing.T) {
	var cfg struct {
		Timeout Duration   `json:"timeout"`
		Retries []Duration `json:"retries"`
	}
	in := `{"timeout":"2s","retries":["10ms","1m"]}`
	if err := json.Unmarshal([]byte(in), &cfg); err != nil {
		t.Fatalf("json.Unmarshal(%q) = %v, want nil", in, err)
	}
	if cfg.Timeout.Std() != 2*time.Second || len(cfg.Retries) != 2 || cfg.Retries[1].Std() != time.Minute {
		t.Errorf("json.Unmarshal(%q) = %+v, want timeout 2s and retries [10ms 1m]", in, cfg)
	}
}

func TestHealthStatusString(t *testing.T) {
	tests := []struct {
		s    HealthStatus
		want string
	}{
		{StatusReady, "ready"},
		{StatusDegraded, "degraded"},
		{StatusNotReady, "not_ready"},
		{0, "status(0)"},
		{42, "status(42)"},
	}
	for _, tt := range tests {
		if got := tt.s.String(); got != tt.want {
			t.Errorf("HealthStatus(%d).String() = %q, want %q", int(tt.s), got, tt.want)
		}
	}
}

func TestRuntimeDecodeConfig(t *testing.T) {
	type config struct {
		Greeting string   `json:"greeting"`
		Timeout  Duration `json:"timeout"`
		Tags     []string `json:"tags"`
	}
	tests := []struct {
		name    string
		config  string
		want    config
		wantErr string
	}{
		{"all fields", `{"greeting":"hi","timeout":"3s","tags":["a","b"]}`, config{"hi", Duration(3 * time.Second), []string{"a", "b"}}, ""},
		{"empty object", `{}`, config{}, ""},
		{"null attribute", `{"greeting":null}`, config{}, ""},
		{"unknown field", `{"greeting":"hi","colour":"red"}`, config{}, `unknown field "colour"`},
		{"wrong type", `{"greeting":3}`, config{}, "decode config"},
		{"bad duration", `{"timeout":"soon"}`, config{}, "decode config"},
		{"not an object", `[]`, config{}, "decode config"},
		{"empty", ``, config{}, "decode config"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := &Runtime{config: []byte(tt.config)}
			var got config
			err := rt.DecodeConfig(&got)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("DecodeConfig(%q) = %v, want error containing %q", tt.config, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeConfig(%q) = %v, want nil", tt.config, err)
			}
			if got.Greeting != tt.want.Greeting || got.Timeout != tt.want.Timeout || strings.Join(got.Tags, ",") != strings.Join(tt.want.Tags, ",") {
				t.Errorf("DecodeConfig(%q) = %+v, want %+v", tt.config, got, tt.want)
			}
			if string(rt.RawConfig()) != tt.config {
				t.Errorf("RawConfig() = %q, want %q", rt.RawConfig(), tt.config)
			}
		})
	}
}

func TestConfigError(t *testing.T) {
	tests := []struct {
		err  *ConfigError
		want string
	}{
		{&ConfigError{Attribute: "max_items", Message: "must be positive"}, "max_items: must be positive"},
		{&ConfigError{Message: "no"}, "no"},
		{&ConfigError{Attribute: "port"}, "port: config refused"},
		{&ConfigError{}, "config refused"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("%#v.Error() = %q, want %q", tt.err, got, tt.want)
		}
	}
	wrapped := fmt.Errorf("check: %w", &ConfigError{Attribute: "port", Message: "too big"})
	var ce *ConfigError
	if !errors.As(wrapped, &ce) || ce.Attribute != "port" {
		t.Errorf("errors.As(%v, *ConfigError) = %v, want the port error", wrapped, ce)
	}
}

func TestDurationNullKeepsValue(t *testing.T) {
	// The host sends null for an optional attribute without a default.
	cfg := struct {
		Timeout Duration `json:"timeout"`
	}{Timeout: Duration(time.Second)}
	if err := json.Unmarshal([]byte(`{"timeout":null}`), &cfg); err != nil {
		t.Fatalf("json.Unmarshal(%q) = %v, want nil", `{"timeout":null}`, err)
	}
	if cfg.Timeout.Std() != time.Second {
		t.Errorf("after null, Timeout = %v, want %v (unchanged)", cfg.Timeout.Std(), time.Second)
	}
}
