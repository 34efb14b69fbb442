package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/bus"
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
		{"key not base64", `approver["b"].public_key`, func(c *config) { c.Approvers[1].PublicKey = "!!" }},
		{"key of 31 bytes", `approver["a"].public_key`, func(c *config) { c.Approvers[0].PublicKey = pubB64("a")[:40] + "==" }},
		{"one key for two approvers", `approver["b"].public_key`, func(c *config) { c.Approvers[1].PublicKey = pubB64("a") }},
		{"empty approver id", `approver[""]`, func(c *config) { c.Approvers[0].ID = "" }},
		{"approver id over 128 bytes", `approver["` + strings.Repeat("x", 129) + `"]`, func(c *config) { c.Approvers[0].ID = strings.Repeat("x", 129) }},
		{"origin with a space", "origin", func(c *config) { c.Origin = "my log" }},
		{"origin with a plus", "origin", func(c *config) { c.Origin = "a+b" }},
		{"empty origin", "origin", func(c *config) { c.Origin = "" }},
		{"proposal_ttl under 1s", "proposal_ttl", func(c *config) { c.ProposalTTL = sdk.Duration(999e6) }},
		{"proposals_queue 0", "proposals_queue", func(c *config) { c.ProposalsQueue = 0 }},
		{"negative keep", "retention.keep_after_checkpoint", func(c *config) { c.Retention = &retentionConfig{true, -1} }},
		{"consumer name with a capital", "stream_consumers", func(c *config) { c.StreamConsumers = []string{"indexer", "Mirror"} }},
		{"consumer named other", "stream_consumers", func(c *config) { c.StreamConsumers = []string{bus.OtherConsumer} }},
		{"too many consumer names", "stream_consumers", func(c *config) {
			for i := range bus.MaxConsumers + 1 {
				c.StreamConsumers = append(c.StreamConsumers, fmt.Sprint("c", i))
			}
		}},
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

// TestConfigApproverLabels: through the host's decoder, an approver is
// approver "ID" { public_key }; the form without the label and a second
// approver with the same id are refused before Configure runs, and a bad
// key is refused naming its approver.
func TestConfigApproverLabels(t *testing.T) {
	block := func(id string) string { return fmt.Sprintf("approver %q {\n  public_key = %q\n}\n", id, pubB64(id)) }
	h, err := plugintest.Start(t, definition(), plugintest.Options{Config: block("alice") + block("bob"), DataDir: t.TempDir()})
	if err != nil {
		t.Fatalf("Start(two labelled approvers) = %v", err)
	}
	if _, _, err := h.Drain(t.Context(), time.Now().Add(5*time.Second)); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	tests := []struct {
		name, config string
		attr         string // "" for a schema error before Configure
	}{
		{"id as an argument", fmt.Sprintf("approver {\n  id = \"alice\"\n  public_key = %q\n}\n", pubB64("alice")), ""},
		{"no id", fmt.Sprintf("approver {\n  public_key = %q\n}\n", pubB64("alice")), ""},
		{"same id twice", block("alice") + block("alice"), ""},
		{"bad key", block("alice") + "approver \"bob\" {\n  public_key = \"!!\"\n}\n", `approver["bob"].public_key`},
		{"alice's key for bob", block("alice") + fmt.Sprintf("approver \"bob\" {\n  public_key = %q\n}\n", pubB64("alice")), `approver["bob"].public_key`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plugintest.Refused(t, definition(), plugintest.Options{Config: tt.config, DataDir: t.TempDir()}, tt.attr)
		})
	}
}
