package config

import (
	"path/filepath"
	"testing"
	"time"
)

func TestLoadConnLimits(t *testing.T) {
	path := filepath.Join("testdata", "conns.hcl")
	c, diags := Load(path)
	if diags.HasErrors() {
		t.Fatalf("Load(%q) diagnostics: %s", path, diags.Error())
	}
	tests := []struct {
		name      string
		got, want any
	}{
		{"max_conns", c.Limits.MaxConns, 50},
		{"max_conns_per_ip", c.Limits.MaxConnsPerIP, 8},
		{"max_conns_per_ip default", c.Limits.MaxConnsPerIPDefault, false},
		{"max_streams_per_ip", c.Limits.MaxStreamsPerIP, 4},
		{"stream_write_timeout", c.Limits.StreamWriteTimeout, 2 * time.Second},
		{"stream_max_lifetime", c.Limits.StreamMaxLifetime, time.Hour},
		{"stream_buffer", c.Limits.StreamBuffer, int64(16384)},
		{"max_inflight", c.Plugins[0].MaxInflight, 64},
		{"max_streams", c.Plugins[0].MaxStreams, 16},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("Load(%q) %s = %v, want %v", path, tt.name, tt.got, tt.want)
		}
	}
}

// TestMaxConnsPerIPDefault pins the default at a quarter of max_conns,
// rounded up, and an explicit value, 0 included, as given.
func TestMaxConnsPerIPDefault(t *testing.T) {
	tests := []struct {
		limits      string
		want        int
		wantDefault bool
	}{
		{"", 2500, true},
		{"max_conns = 200", 50, true},
		{"max_conns = 10", 3, true},
		{"max_conns = 4", 1, true},
		{"max_conns = 1", 1, true},
		{"max_conns = 200\n  max_conns_per_ip = 0", 0, false},
		{"max_conns = 200\n  max_conns_per_ip = 200", 200, false},
		{"max_conns_per_ip = 7", 7, false},
	}
	for _, tt := range tests {
		src := "limits {\n  " + tt.limits + "\n}\n"
		c, diags := Parse([]byte(src), "conns.hcl")
		if diags.HasErrors() {
			t.Fatalf("Parse(%q) diagnostics: %s", src, diags.Error())
		}
		if c.Limits.MaxConnsPerIP != tt.want || c.Limits.MaxConnsPerIPDefault != tt.wantDefault {
			t.Errorf("Parse(%q) max_conns_per_ip = %d (default %t), want %d (default %t)",
				src, c.Limits.MaxConnsPerIP, c.Limits.MaxConnsPerIPDefault, tt.want, tt.wantDefault)
		}
	}
}

func TestStreamMaxLifetimeZero(t *testing.T) {
	for _, v := range []string{`"0"`, `"0s"`} {
		c, diags := Parse([]byte("limits {\n  stream_max_lifetime = "+v+"\n}\n"), "zero.hcl")
		if diags.HasErrors() {
			t.Fatalf("Parse(stream_max_lifetime = %s) diagnostics: %s", v, diags.Error())
		}
		if c.Limits.StreamMaxLifetime != 0 {
			t.Errorf("Parse(stream_max_lifetime = %s) = %v, want 0", v, c.Limits.StreamMaxLifetime)
		}
	}
}
