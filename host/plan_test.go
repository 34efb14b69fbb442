package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/plughost/plughost/host/config"
	"github.com/plughost/plughost/host/supervisor"
	"github.com/plughost/plughost/sdk"
)

// TestConfigErrDiag: a plugin's refusal points at what its ConfigError's
// path names in the operator's file, inside nested and labelled blocks,
// and at the config block when the path leads nowhere.
func TestConfigErrDiag(t *testing.T) {
	const src = `plugin "gw" {
  path = "gw"
  config {
    workers = 3
    upstream "wallet" {
      url = "http://127.0.0.1:7001"
    }
    retry {
      backoff = "1ms"
    }
  }
}
`
	c, diags := config.Parse([]byte(src), "gw.hcl")
	if diags.HasErrors() {
		t.Fatalf("Parse: %s", diags.Error())
	}
	p := c.Plugins[0]
	tests := []struct {
		attribute    string
		line, column int
	}{
		{"workers", 4, 15},
		{`upstream["wallet"].url`, 6, 13},
		{`upstream[0]`, 5, 5},
		{`upstream["nowhere"].url`, 3, 3},
		{"retry.backoff", 9, 17},
		{"retry.cap", 8, 5},
		{"", 3, 3},
		{"no such thing", 3, 3},
	}
	for _, tt := range tests {
		err := fmt.Errorf("start plugin: %w", &sdk.ConfigError{Attribute: tt.attribute, Message: "no"})
		got := configErrDiag(p, err)
		if len(got) != 1 || got[0].Subject == nil {
			t.Fatalf("configErrDiag(%q) = %v, want one diagnostic with a subject", tt.attribute, got)
		}
		if s := got[0].Subject; s.Filename != "gw.hcl" || s.Start.Line != tt.line || s.Start.Column != tt.column {
			t.Errorf("configErrDiag(%q) subject = %s, want gw.hcl:%d,%d", tt.attribute, s, tt.line, tt.column)
		}
	}
	// The supervisor's error of a refusal starts with its place, which
	// the diagnostic shows as its subject: the detail leaves it out.
	located := &supervisor.LocatedError{At: "gw.hcl:4:15", Err: fmt.Errorf("plugin \"gw\" config: %w", &sdk.ConfigError{Attribute: "workers", Message: "no"})}
	got := configErrDiag(p, fmt.Errorf("start plugin: %w", located))
	if len(got) != 1 || strings.Contains(got[0].Detail, "gw.hcl") || !strings.Contains(got[0].Detail, "no") {
		t.Errorf("configErrDiag of a located refusal = %v, want the refusal without its place in the detail", got)
	}
}

// TestFingerprintMaxBodyBytes: a reload that changes a plugin block's
// max_body_bytes replaces the plugin, as for its other settings; one that
// changes only the host-wide limit does not, since the ingress applies it
// as it is.
func TestFingerprintMaxBodyBytes(t *testing.T) {
	cfg := &config.Config{Limits: config.Limits{MaxBodyBytes: 1 << 20}}
	p := config.PluginBlock{Name: "rewarder", Path: "rewarder", Mount: "/rewarder", MaxInflight: 512}
	unset := fingerprint(cfg, p)
	p.MaxBodyBytes = 8 << 20
	if got := fingerprint(cfg, p); got == unset {
		t.Errorf("fingerprint with max_body_bytes = 8388608 = %q, the same as without it", got)
	}
	p.MaxBodyBytes = 0
	cfg.Limits.MaxBodyBytes = 4 << 20
	if got := fingerprint(cfg, p); got != unset {
		t.Errorf("fingerprint after the host-wide max_body_bytes changed = %q, want %q as before", got, unset)
	}
}
