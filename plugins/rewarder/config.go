package main

import (
	"runtime"
	"time"

	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/bus"
)

// config is the plugin's config block; its json tags are the attributes
// declared in schema, and the host has applied the defaults. Numbers are
// float64 so that check can say what is wrong with 1.5.
type config struct {
	ComputeWorkers   float64       `json:"compute_workers"`
	WorkQueue        float64       `json:"work_queue"`
	MaxContributions float64       `json:"max_contributions"`
	ArtifactDir      string        `json:"artifact_dir"`
	EpochDuration    sdk.Duration  `json:"epoch_duration"`
	IOInflight       float64       `json:"io_inflight"`
	WalletPlugin     string        `json:"wallet_plugin"`
	Rescan           sdk.Duration  `json:"rescan"`
	Retention        sdk.Duration  `json:"retention"`
	EventsBuffer     float64       `json:"events_buffer"`
	EventConsumers   []string      `json:"event_consumers"`
	QueueCapacity    float64       `json:"queue_capacity"`
	MaxBatch         float64       `json:"max_batch"`
	CommitTimeout    sdk.Duration  `json:"commit_timeout"`
	Settle           *settleConfig `json:"settle"` // null when the block is absent
}

type settleConfig struct {
	Retries float64      `json:"retries"`
	Backoff sdk.Duration `json:"backoff"`
	Timeout sdk.Duration `json:"timeout"`
}

// settings are the checked config values.
type settings struct {
	computeWorkers, workQueue, maxContributions, ioInflight int
	queueCapacity, maxBatch                                 int
	artifactDir, wallet                                     string
	epochDuration, rescan, commitTimeout, retention         time.Duration
	retries                                                 int
	eventsBuffer                                            int
	eventConsumers                                          []string // the names bus_lagged_total labels by name
	backoff, timeout                                        time.Duration
}

func schema() sdk.Schema {
	return sdk.Schema{Attrs: []sdk.Attr{
		{Name: "compute_workers", Type: sdk.TypeNumber, Default: 0, Description: "goroutines computing epochs; 0 means the number of CPUs"},
		{Name: "work_queue", Type: sdk.TypeNumber, Default: 512, Description: "epochs waiting for a compute worker; beyond it computes get 429 busy"},
		{Name: "max_contributions", Type: sdk.TypeNumber, Default: 200000, Description: "most contributions in one epoch; beyond it computes get 400"},
		{Name: "artifact_dir", Type: sdk.TypeString, Default: "", Description: "directory of the run.json and commitment artifacts; empty means artifacts under the plugin's data directory"},
		{Name: "epoch_duration", Type: sdk.TypeDuration, Default: "1h", Description: "length of an epoch; a settlement round ends by half of it"},
		{Name: "io_inflight", Type: sdk.TypeNumber, Default: 4, Description: "epochs settling through the wallet at once"},
		{Name: "wallet_plugin", Type: sdk.TypeString, Default: "wallet", Description: "instance name of the wallet plugin that settlement calls through the host"},
		{Name: "rescan", Type: sdk.TypeDuration, Default: "5s", Description: "how often stored epochs left waiting (a full queue, a restart) are picked up again"},
		{Name: "retention", Type: sdk.TypeDuration, Default: "720h", Description: "how long a settled epoch keeps its sealed inputs, outbox and artifacts; then they are removed, and its manifest stays, marked pruned; 0 keeps them forever"},
		{Name: "events_buffer", Type: sdk.TypeNumber, Default: 1024, Description: "state changes buffered for each GET /v1/events consumer; a consumer further behind loses the oldest, counted in bus_lagged_total"},
		{Name: "event_consumers", Type: sdk.ListOf(sdk.TypeString), Default: []string{}, Description: "events consumer names (?consumer=) that bus_lagged_total counts under their own consumer label; every other name counts as \"other\", so that clients cannot add series"},
		{Name: "queue_capacity", Type: sdk.TypeNumber, Default: 512, Description: "store writes waiting to commit; beyond it requests get 429 busy"},
		{Name: "max_batch", Type: sdk.TypeNumber, Default: 256, Description: "most writes per group commit (one write-ahead log record and fdatasync)"},
		{Name: "commit_timeout", Type: sdk.TypeDuration, Default: "1s", Description: "deadline of one commit attempt"},
	}, Blocks: []sdk.Block{{
		Name:        "settle",
		Description: "settlement calls to the wallet",
		Schema: sdk.Schema{Attrs: []sdk.Attr{
			{Name: "retries", Type: sdk.TypeNumber, Default: 3, Description: "attempts per batch part per round before the epoch is quarantined as settlement_unavailable"},
			{Name: "backoff", Type: sdk.TypeDuration, Default: "100ms", Description: "least delay before a retry; the delay is drawn from backoff to 2.5 × backoff"},
			{Name: "timeout", Type: sdk.TypeDuration, Default: "2s", Description: "deadline of one call to the wallet"},
		}},
	}}}
}

// check refuses what the schema cannot express, naming the attribute.
func (c config) check(dataDir string) (settings, error) {
	var s settings
	var ck sdk.ConfigChecker
	s.computeWorkers = ck.Whole("compute_workers", c.ComputeWorkers, 0, 1024)
	s.workQueue = ck.Whole("work_queue", c.WorkQueue, 1, 1<<20)
	s.maxContributions = ck.Whole("max_contributions", c.MaxContributions, 1, 10_000_000)
	// At most 24h: a settlement round ends by half an epoch, and the
	// wallet forgets an idempotency key after 24 h; retries must stop
	// well inside that, or a forgotten key could pay twice.
	s.epochDuration = ck.Duration("epoch_duration", c.EpochDuration, time.Second, 24*time.Hour)
	s.ioInflight = ck.Whole("io_inflight", c.IOInflight, 1, 1024)
	s.rescan = ck.Duration("rescan", c.Rescan, 10*time.Millisecond, time.Hour)
	if c.Retention.Std() != 0 {
		s.retention = ck.Duration("retention", c.Retention, time.Hour, 100*365*24*time.Hour)
	}
	s.eventsBuffer = ck.Whole("events_buffer", c.EventsBuffer, 1, 1<<20)
	s.eventConsumers = c.EventConsumers
	if cerr := bus.CheckConsumers(c.EventConsumers); cerr != nil {
		ck.Refuse("event_consumers", "%v", cerr)
	}
	s.queueCapacity = ck.Whole("queue_capacity", c.QueueCapacity, 1, 1<<20)
	s.maxBatch = ck.Whole("max_batch", c.MaxBatch, 1, 4096)
	s.commitTimeout = ck.Duration("commit_timeout", c.CommitTimeout, time.Millisecond, time.Minute)
	st := settleConfig{Retries: 3, Backoff: sdk.Duration(100 * time.Millisecond), Timeout: sdk.Duration(2 * time.Second)}
	if c.Settle != nil {
		st = *c.Settle
	}
	s.retries = ck.Whole("settle.retries", st.Retries, 1, 100)
	s.backoff = ck.Duration("settle.backoff", st.Backoff, 0, time.Minute)
	s.timeout = ck.Duration("settle.timeout", st.Timeout, time.Millisecond, time.Minute)
	s.wallet = c.WalletPlugin
	if s.wallet == "" {
		ck.Refuse("wallet_plugin", "must name the wallet instance")
	}
	if err := ck.Err(); err != nil {
		return s, err
	}
	if s.computeWorkers == 0 {
		s.computeWorkers = runtime.NumCPU()
	}
	s.artifactDir = c.ArtifactDir
	if s.artifactDir == "" {
		s.artifactDir = dataDir + "/artifacts"
	}
	return s, nil
}
