package main

import (
	"errors"
	"testing"

	"github.com/plughost/plughost/sdk"
)

func TestConfigCheck(t *testing.T) {
	good := func() config {
		return config{
			Approvers: []approverConfig{{"a", pubB64("a")}, {"b", pubB64("b")}},
			Quorum:    2, Origin: "example.com/log", CheckpointInterval: sdk.Duration(1e10), ProposalTTL: sdk.Duration(36e11),
			ProposalsQueue: 512, ApprovalsQueue: 512, StreamBuffer: 1024, MaxBatch: 256,
			CommitTimeout: sdk.Duration(1e9), CommitDeadline: sdk.Duration(2e9),
		}
	}
	if s, err := good().check(); err != nil || s.quorum != 2 || len(s.approvers) != 2 {
		t.Fatalf("check(good) = %+v, %v", s, err)
	}
	tests := []struct {
		name, attr string
		edit       func(*config)
	}{
		{"quorum over the approvers", "quorum", func(c *config) { c.Quorum = 3 }},
		{"quorum 0", "quorum", func(c *config) { c.Quorum = 0 }},
		{"fractional quorum", "quorum", func(c *config) { c.Quorum = 1.5 }},
		{"key not base64", "approver[1]", func(c *config) { c.Approvers[1].PublicKey = "!!" }},
		{"key of 31 bytes", "approver[0]", func(c *config) { c.Approvers[0].PublicKey = pubB64("a")[:40] + "==" }},
		{"approver twice", "approver[1]", func(c *config) { c.Approvers[1].ID = "a" }},
		{"empty approver id", "approver[0]", func(c *config) { c.Approvers[0].ID = "" }},
		{"origin with a space", "origin", func(c *config) { c.Origin = "my log" }},
		{"origin with a plus", "origin", func(c *config) { c.Origin = "a+b" }},
		{"empty origin", "origin", func(c *config) { c.Origin = "" }},
		{"proposal_ttl under 1s", "proposal_ttl", func(c *config) { c.ProposalTTL = sdk.Duration(999e6) }},
		{"proposals_queue 0", "proposals_queue", func(c *config) { c.ProposalsQueue = 0 }},
		{"negative keep", "keep_after_checkpoint", func(c *config) { c.Retention = &retentionConfig{true, -1} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good()
			tt.edit(&c)
			_, err := c.check()
			var ce *sdk.ConfigError
			if !errors.As(err, &ce) || ce.Attribute != tt.attr {
				t.Errorf("check() = %v, want a ConfigError on %s", err, tt.attr)
			}
		})
	}
	// No approvers at all is a read-only registry, whatever the quorum.
	c := good()
	c.Approvers = nil
	if _, err := c.check(); err != nil {
		t.Errorf("check(no approvers) = %v, want nil", err)
	}
}
