package main

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"math"
	"time"

	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/bus"
)

// config is the plugin's config block; its json tags are the attributes
// declared in schema, and the host has applied the defaults. Numbers are
// float64 so that check can say what is wrong with 1.5.
type config struct {
	Approvers          []approverConfig `json:"approver"`
	Quorum             float64          `json:"quorum"`
	Origin             string           `json:"origin"`
	SigningKeyFile     string           `json:"signing_key_file"`
	CheckpointInterval sdk.Duration     `json:"checkpoint_interval"`
	ProposalTTL        sdk.Duration     `json:"proposal_ttl"`
	Retention          *retentionConfig `json:"retention"` // null when the block is absent
	ProposalsQueue     float64          `json:"proposals_queue"`
	ApprovalsQueue     float64          `json:"approvals_queue"`
	StreamBuffer       float64          `json:"stream_buffer"`
	StreamConsumers    []string         `json:"stream_consumers"`
	MaxBatch           float64          `json:"max_batch"`
	CommitTimeout      sdk.Duration     `json:"commit_timeout"`
	CommitDeadline     sdk.Duration     `json:"commit_deadline"`
}

type approverConfig struct {
	ID        string `json:"id"`
	PublicKey string `json:"public_key"`
}

type retentionConfig struct {
	Enabled             bool    `json:"enabled"`
	KeepAfterCheckpoint float64 `json:"keep_after_checkpoint"`
}

// settings are the checked config values.
type settings struct {
	approvers          map[string]ed25519.PublicKey
	quorum             int
	origin             string
	signingKeyFile     string
	checkpointInterval time.Duration
	proposalTTL        time.Duration
	retention          bool
	keepAfter          uint64
	proposalsQueue     int
	approvalsQueue     int
	streamBuffer       int
	streamConsumers    []string // the consumer names bus_lagged_total labels by name
	maxBatch           int
	commitTimeout      time.Duration
	commitDeadline     time.Duration
}

func schema() sdk.Schema {
	return sdk.Schema{Attrs: []sdk.Attr{
		{Name: "quorum", Type: sdk.TypeNumber, Default: 2, Description: "distinct approvers whose signatures commit a proposal"},
		{Name: "origin", Type: sdk.TypeString, Default: "plughost-registry", Description: "the log's origin: first line of each checkpoint and the name of its signing key"},
		{Name: "signing_key_file", Type: sdk.TypeString, Default: "", Description: "note signing key (PRIVATE+KEY+...); empty: generated into the data dir (0600) on first start. Keep it secret: whoever reads it can sign checkpoints"},
		{Name: "checkpoint_interval", Type: sdk.TypeDuration, Default: "10s", Description: "how often a checkpoint of a grown log is signed"},
		{Name: "proposal_ttl", Type: sdk.TypeDuration, Default: "24h", Description: "how long a proposal may gather approvals; an expired one is swept within a tenth of it (at most 10 minutes)"},
		{Name: "proposals_queue", Type: sdk.TypeNumber, Default: 512, Description: "proposals waiting to commit; beyond it proposals get 429"},
		{Name: "approvals_queue", Type: sdk.TypeNumber, Default: 512, Description: "approvals waiting to commit; beyond it approvals get 429"},
		{Name: "stream_buffer", Type: sdk.TypeNumber, Default: 1024, Description: "events buffered per stream consumer; a consumer further behind gets a lagged event"},
		{Name: "stream_consumers", Type: sdk.ListOf(sdk.TypeString), Default: []string{}, Description: "stream consumer names (?consumer=) that bus_lagged_total counts under their own consumer label; every other name counts as \"other\", so that clients cannot add series"},
		{Name: "max_batch", Type: sdk.TypeNumber, Default: 256, Description: "most operations per group commit (one write-ahead log record and fdatasync)"},
		{Name: "commit_timeout", Type: sdk.TypeDuration, Default: "1s", Description: "deadline of one group commit attempt"},
		{Name: "commit_deadline", Type: sdk.TypeDuration, Default: "2s", Description: "how long a proposal or approval waits for its commit before 503"},
	}, Blocks: []sdk.Block{{
		Name: "approver", Labels: []string{"id"}, List: true,
		Description: "an approver, labelled with the id its approvals carry, and its Ed25519 public key. With none, nothing can commit: the registry serves what it holds, read-only",
		Schema: sdk.Schema{Attrs: []sdk.Attr{
			{Name: "public_key", Type: sdk.TypeString, Required: true, Description: "standard base64 of the 32-byte Ed25519 public key"},
		}},
	}, {
		Name:        "retention",
		Description: "pruning of entry data that a signed checkpoint covers",
		Schema: sdk.Schema{Attrs: []sdk.Attr{
			{Name: "enabled", Type: sdk.TypeBool, Default: false, Description: "prune entry data (hashes and proofs stay)"},
			{Name: "keep_after_checkpoint", Type: sdk.TypeNumber, Default: 1000, Description: "entries below the latest checkpoint's size that are kept"},
		}},
	}}}
}

// check refuses what the schema cannot express, naming the path of the
// attribute (approver["alice"].public_key). The host has refused two
// approver blocks with the same id.
func (c config) check() (settings, error) {
	var s settings
	var ck sdk.ConfigChecker
	s.approvers = make(map[string]ed25519.PublicKey, len(c.Approvers))
	keyOf := make(map[string]string, len(c.Approvers)) // public key → the approver declaring it
	for _, a := range c.Approvers {
		at := fmt.Sprintf("approver[%q]", a.ID)
		pub, derr := base64.StdEncoding.DecodeString(a.PublicKey)
		switch {
		case a.ID == "" || len(a.ID) > 128:
			return s, &sdk.ConfigError{Attribute: at, Message: "the id must be 1 to 128 bytes"}
		case derr != nil || len(pub) != ed25519.PublicKeySize:
			return s, &sdk.ConfigError{Attribute: at + ".public_key", Message: "must be standard base64 of 32 bytes"}
		case keyOf[string(pub)] != "":
			// The quorum counts distinct approvers: one key under two ids
			// would let its holder approve twice.
			return s, &sdk.ConfigError{Attribute: at + ".public_key",
				Message: fmt.Sprintf("is approver %q's key too; each approver needs a key of its own, or one holder counts twice towards the quorum", keyOf[string(pub)])}
		}
		keyOf[string(pub)] = a.ID
		s.approvers[a.ID] = ed25519.PublicKey(pub)
	}
	s.quorum = ck.Whole("quorum", c.Quorum, 1, 64)
	s.origin = c.Origin
	s.signingKeyFile = c.SigningKeyFile
	s.checkpointInterval = ck.Duration("checkpoint_interval", c.CheckpointInterval, 10*time.Millisecond, 24*time.Hour)
	s.proposalTTL = ck.Duration("proposal_ttl", c.ProposalTTL, time.Second, 365*24*time.Hour)
	s.proposalsQueue = ck.Whole("proposals_queue", c.ProposalsQueue, 1, 1<<20)
	s.approvalsQueue = ck.Whole("approvals_queue", c.ApprovalsQueue, 1, 1<<20)
	s.streamBuffer = ck.Whole("stream_buffer", c.StreamBuffer, 1, 1<<20)
	s.streamConsumers = c.StreamConsumers
	if cerr := bus.CheckConsumers(c.StreamConsumers); cerr != nil {
		ck.Refuse("stream_consumers", "%v", cerr)
	}
	s.maxBatch = ck.Whole("max_batch", c.MaxBatch, 1, 4096)
	s.commitTimeout = ck.Duration("commit_timeout", c.CommitTimeout, time.Millisecond, time.Minute)
	s.commitDeadline = ck.Duration("commit_deadline", c.CommitDeadline, time.Millisecond, time.Minute)
	if c.Retention != nil {
		s.retention = c.Retention.Enabled
		s.keepAfter = uint64(ck.Whole("retention.keep_after_checkpoint", c.Retention.KeepAfterCheckpoint, 0, math.MaxInt32))
	}
	// The checker keeps the first refusal: these count only when every
	// value above passed.
	switch {
	case len(s.approvers) > 0 && s.quorum > len(s.approvers):
		ck.Refuse("quorum", "must be at most the %d approvers declared, got %d", len(s.approvers), s.quorum)
	case !validKeyName(s.origin):
		ck.Refuse("origin", "must be non-empty, without spaces or '+'")
	}
	return s, ck.Err()
}

// validKeyName reports whether name can name a note key (and so the
// checkpoint's origin): printable, no spaces, no '+'.
func validKeyName(name string) bool {
	if name == "" {
		return false
	}
	for _, r := range name {
		if r <= ' ' || r == '+' || r > '~' {
			return false
		}
	}
	return true
}
