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
