package main

import (
	"runtime"
	"time"

	"github.com/plughost/plughost/sdk"
)

// config is the plugin's config block; its json tags are the attributes
// declared in schema, and the host has applied the defaults. Numbers are
// float64 so that check can say what is wrong with 1.5.
type config struct {
	ReadyShards       float64      `json:"ready_shards"`
	ShardCapacity     float64      `json:"shard_capacity"`
	MaxMessageBytes   float64      `json:"max_message_bytes"`
	VisibilityMsMin   float64      `json:"visibility_ms_min"`
	DefaultVisibility sdk.Duration `json:"default_visibility"`
	MaxAttempts       float64      `json:"max_attempts"`
	DedupWindow       sdk.Duration `json:"dedup_window"`
	Retention         sdk.Duration `json:"retention"`
	GlobalInflight    float64      `json:"global_inflight"`
	BackoffBase       sdk.Duration `json:"backoff_base"`
	BackoffMax        sdk.Duration `json:"backoff_max"`
	QueueCapacity     float64      `json:"queue_capacity"`
	Committers        float64      `json:"committers"`
	MaxBatch          float64      `json:"max_batch"`
	CommitTimeout     sdk.Duration `json:"commit_timeout"`
	CapCacheTTL       sdk.Duration `json:"cap_cache_ttl"`
	Auth              *authConfig  `json:"auth"` // null when the block is absent
}

type authConfig struct {
	Enabled     bool   `json:"enabled"`
	RootKeyFile string `json:"root_key_file"`
}

// settings are the checked config values.
type settings struct {
	readyShards, shardCapacity, maxMessageBytes, globalInflight int
	queueCapacity, committers, maxBatch                         int
	visibilityMin, defaultVisibility, commitTimeout             time.Duration
	rules                                                       rules
	capCacheTTL                                                 time.Duration
	auth                                                        authConfig
}

func schema() sdk.Schema {
	return sdk.Schema{Attrs: []sdk.Attr{
		{Name: "ready_shards", Type: sdk.TypeNumber, Default: 4, Description: "shards topics hash to, each with its own bounded send intake"},
		{Name: "shard_capacity", Type: sdk.TypeNumber, Default: 1024, Description: "sends in progress per shard; beyond it sends get 429 shard_full"},
		{Name: "max_message_bytes", Type: sdk.TypeNumber, Default: 262144, Description: "largest payload, decoded; beyond it sends get 413"},
		{Name: "visibility_ms_min", Type: sdk.TypeNumber, Default: 250, Description: "smallest visibility_ms a receive or extend may ask for"},
		{Name: "default_visibility", Type: sdk.TypeDuration, Default: "5s", Description: "visibility of a receive that names none"},
		{Name: "max_attempts", Type: sdk.TypeNumber, Default: 5, Description: "deliveries after which a message moves to TOPIC.dlq"},
		{Name: "dedup_window", Type: sdk.TypeDuration, Default: "5m", Description: "how long a send's Idempotency-Key answers with the first message, kept after the message is acked"},
		{Name: "retention", Type: sdk.TypeDuration, Default: "96h", Description: "how long a message is kept after its send, whatever its state; 0 keeps it until acked"},
		{Name: "global_inflight", Type: sdk.TypeNumber, Default: 120000, Description: "messages in flight across topics; beyond it receives get 429 inflight_cap"},
		{Name: "backoff_base", Type: sdk.TypeDuration, Default: "200ms", Description: "base of the full-jitter delay of a nack without delay_ms and of a failed delivery"},
		{Name: "backoff_max", Type: sdk.TypeDuration, Default: "60s", Description: "cap of that delay"},
		{Name: "queue_capacity", Type: sdk.TypeNumber, Default: 512, Description: "operations waiting to commit; beyond it requests get 429 busy"},
		{Name: "committers", Type: sdk.TypeNumber, Default: 0, Description: "committer goroutines; 0 means the number of CPUs"},
		{Name: "max_batch", Type: sdk.TypeNumber, Default: 256, Description: "most operations per group commit (one write-ahead log record and fdatasync)"},
		{Name: "commit_timeout", Type: sdk.TypeDuration, Default: "1s", Description: "deadline of one commit attempt"},
		{Name: "cap_cache_ttl", Type: sdk.TypeDuration, Default: "1m", Description: "how long a capability token's verification is cached"},
	}, Blocks: []sdk.Block{{
		Name:        "auth",
		Description: "capability tokens: every request needs a bearer macaroon minted with the root key (mailbox mint)",
		Schema: sdk.Schema{Attrs: []sdk.Attr{
			{Name: "enabled", Type: sdk.TypeBool, Default: false, Description: "require tokens"},
			{Name: "root_key_file", Type: sdk.TypeString, Default: "", Description: "file holding the root key, at least 32 bytes; keep it secret: whoever reads it can mint any token"},
		}},
	}}}
}

// check refuses what the schema cannot express, naming the attribute.
func (c config) check() (settings, error) {
	var s settings
	var ck sdk.ConfigChecker
	s.readyShards = ck.Whole("ready_shards", c.ReadyShards, 1, 1024)
	s.shardCapacity = ck.Whole("shard_capacity", c.ShardCapacity, 1, 1<<20)
	// The host caps request bodies at 1 MiB: a payload, base64 in JSON,
	// of more than 3/4 of that could never arrive.
	s.maxMessageBytes = ck.Whole("max_message_bytes", c.MaxMessageBytes, 1, 768<<10)
	s.visibilityMin = time.Duration(ck.Whole("visibility_ms_min", c.VisibilityMsMin, 1, 3_600_000)) * time.Millisecond
	s.defaultVisibility = ck.Duration("default_visibility", c.DefaultVisibility, time.Millisecond, 12*time.Hour)
	maxAttempts := ck.Whole("max_attempts", c.MaxAttempts, 1, 1000)
	dedup := ck.Duration("dedup_window", c.DedupWindow, time.Second, 7*24*time.Hour)
	retention := ck.Duration("retention", c.Retention, 0, 365*24*time.Hour)
	s.globalInflight = ck.Whole("global_inflight", c.GlobalInflight, 1, 1<<24)
	base := ck.Duration("backoff_base", c.BackoffBase, 0, time.Hour)
	bmax := ck.Duration("backoff_max", c.BackoffMax, 0, 24*time.Hour)
	s.queueCapacity = ck.Whole("queue_capacity", c.QueueCapacity, 1, 1<<20)
	s.committers = ck.Whole("committers", c.Committers, 0, 1024)
	s.maxBatch = ck.Whole("max_batch", c.MaxBatch, 1, 4096)
	s.commitTimeout = ck.Duration("commit_timeout", c.CommitTimeout, time.Millisecond, time.Minute)
	s.capCacheTTL = ck.Duration("cap_cache_ttl", c.CapCacheTTL, 0, time.Hour)
	if c.Auth != nil {
		s.auth = *c.Auth
	}
	// The checker keeps the first refusal: these count only when every
	// value above passed.
	switch {
	case s.defaultVisibility < s.visibilityMin:
		ck.Refuse("default_visibility", "must be at least visibility_ms_min (%v), got %v", s.visibilityMin, s.defaultVisibility)
	case s.auth.Enabled && s.auth.RootKeyFile == "":
		ck.Refuse("auth", "root_key_file is required when enabled")
	case bmax < base:
		ck.Refuse("backoff_max", "must be at least backoff_base (%v), got %v", base, bmax)
	}
	if err := ck.Err(); err != nil {
		return s, err
	}
	if s.committers == 0 {
		s.committers = runtime.NumCPU()
	}
	s.rules = rules{maxAttempts: uint32(maxAttempts), backoffBase: base, backoffMax: bmax, dedup: dedup, retention: retention}
	return s, nil
}
