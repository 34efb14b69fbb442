package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/sdk"
)

// Limits too small to be worth a config attribute.
const (
	// maxBodyBytes caps a POST /greetings body, far below the host's
	// max_body_bytes: a name and a greeting are short.
	maxBodyBytes = 4 << 10
	// maxGreetingLen caps a greeting, in characters.
	maxGreetingLen = 100
	// maxSlow bounds GET /slow so one request cannot hold a slot for long.
	maxSlow = 4 * time.Second
)

// config is the plugin's config block. Its json tags are the attribute
// names declared in definition, and the host has applied the defaults.
type config struct {
	Greeting     string       `json:"greeting"`
	MaxNameLen   int          `json:"max_name_len"`
	MaxGreetings int          `json:"max_greetings"`
	Cooldown     sdk.Duration `json:"cooldown"`
}

// greeter serves the plugin's routes. configure sets every field before
// the host sends the first request, and nothing changes them
// afterwards, so handlers read them without locks.
type greeter struct {
	cfg       config
	logger    hclog.Logger
	path      string // where drain saves the custom greetings
	store     *store
	greetings *prometheus.CounterVec
}

// definition describes the plugin. main serves it; the tests serve it
// in-process with plugintest.
func definition() sdk.Plugin {
	g := &greeter{}
	mux := sdk.NewMux()
	mux.HandleFunc("GET /{$}", g.root)
	mux.HandleFunc("GET /greet/{name}", g.greet)
	mux.HandleFunc("POST /greetings", g.setGreeting)
	// Its own deadline, so the longest sleep fits whatever the operator's
	// request_timeout is.
	mux.HandleFunc("GET /slow", slow, sdk.Timeout(maxSlow+time.Second))
	return sdk.Plugin{
		Name:    "greeter",
		Version: "0.1.0",
		Routes:  mux,
		Config: sdk.Schema{Attrs: []sdk.Attr{
			{Name: "greeting", Type: sdk.TypeString, Default: "hello", Description: "what GET / answers and names are greeted with"},
			{Name: "max_name_len", Type: sdk.TypeNumber, Default: 64, Description: "longest name accepted, in characters"},
			{Name: "max_greetings", Type: sdk.TypeNumber, Default: 10000, Description: "most custom greetings kept"},
			{Name: "cooldown", Type: sdk.TypeDuration, Default: "5s", Description: "how soon a custom greeting may change again"},
		}},
		// drain saves the greetings that the next process loads in
		// configure: the two must not overlap.
		SingleInstance: true,
		Configure:      g.configure,
		Drain:          g.drain,
		Health:         g.health,
	}
}

// configure checks the operator's config, loads the greetings the last
// drain saved and registers the metrics. An error refuses the config.
func (g *greeter) configure(_ context.Context, rt *sdk.Runtime) error {
	var c config
	if err := rt.DecodeConfig(&c); err != nil {
		return err
	}
	if err := c.check(); err != nil {
		return err
	}
	g.cfg = c
	g.logger = rt.Logger
	g.path = filepath.Join(rt.DataDir, "greetings.json")
	saved, err := load(g.path)
	if err != nil {
		return err
	}
	g.store = newStore(c.MaxGreetings, c.Cooldown.Std(), saved)

	g.greetings = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "greeter_greetings_total",
		Help: "Greetings served, by kind: plain (GET /), named (with the configured greeting) or custom.",
	}, []string{"kind"})
	for _, kind := range []string{"plain", "named", "custom"} {
		g.greetings.WithLabelValues(kind) // every kind is exported from 0
	}
	stored := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "greeter_custom_greetings",
		Help: "Custom greetings held, including those loaded at start.",
	}, func() float64 { return float64(g.store.len()) })
	for _, m := range []prometheus.Collector{g.greetings, stored} {
		if err := rt.Registerer.Register(m); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	rt.Logger.Info("configured", "greeting", c.Greeting, "saved_greetings", len(saved))
	return nil
}

// check refuses what the schema cannot express, naming the attribute so
// that the host points its diagnostic at it.
func (c config) check() error {
	if err := checkGreeting(c.Greeting); err != nil {
		return &sdk.ConfigError{Attribute: "greeting", Message: err.Error()}
	}
	switch {
	case c.MaxNameLen < 1 || c.MaxNameLen > 1024:
		return &sdk.ConfigError{Attribute: "max_name_len", Message: fmt.Sprintf("must be from 1 to 1024, got %d", c.MaxNameLen)}
	case c.MaxGreetings < 1:
		return &sdk.ConfigError{Attribute: "max_greetings", Message: fmt.Sprintf("must be at least 1, got %d", c.MaxGreetings)}
	case c.Cooldown < 0:
		return &sdk.ConfigError{Attribute: "cooldown", Message: fmt.Sprintf("must not be negative, got %v", c.Cooldown.Std())}
	}
	return nil
}

// drain closes the store, so that a POST still in flight cannot change it
// after the snapshot, and saves the custom greetings for the next process.
// The SDK has already stopped taking new requests, and waits for those in
// flight once drain returns. An error is logged by the SDK.
func (g *greeter) drain(ctx context.Context) error {
	if g.store == nil {
		return nil // Configure never succeeded: nothing to save
	}
	saved := g.store.close()
	if err := save(ctx, g.path, saved); err != nil {
		return err
	}
	g.logger.Info("greetings saved", "count", len(saved), "path", g.path)
	return nil
}

// health answers at once from memory. A full store is degraded: the
// plugin still greets, but refuses new names until the operator raises
// max_greetings.
func (g *greeter) health(context.Context) sdk.Health {
	if n := g.store.len(); n >= g.cfg.MaxGreetings {
		return sdk.Health{
			Status: sdk.StatusDegraded,
			Reason: fmt.Sprintf("%d custom greetings held, max_greetings is %d: new names are refused", n, g.cfg.MaxGreetings),
		}
	}
	return sdk.Health{Status: sdk.StatusReady}
}
