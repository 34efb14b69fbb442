package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/plughost/plughost/sdk"
)

// A plugin's main function describes the plugin and calls Serve. Serve
// only works in a process the plughost host started, so this example is
// not run.
func ExampleServe() {
	type config struct {
		Greeting string       `json:"greeting"`
		MaxSleep sdk.Duration `json:"max_sleep"`
	}
	var cfg config // set by Configure, before any request

	mux := sdk.NewMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, cfg.Greeting)
	})
	mux.HandleFunc("GET /sleep", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(cfg.MaxSleep.Std()):
			fmt.Fprintln(w, "slept")
		case <-r.Context().Done():
			// The caller went away or its deadline passed.
		}
	}, sdk.Timeout(10*time.Second))

	err := sdk.Serve(sdk.Plugin{
		Name:    "hello",
		Version: "0.1.0",
		Routes:  mux,
		Config: sdk.Schema{Attrs: []sdk.Attr{
			{Name: "greeting", Type: sdk.TypeString, Default: "hello"},
			{Name: "max_sleep", Type: sdk.TypeDuration, Default: "1s"},
		}},
		Configure: func(ctx context.Context, rt *sdk.Runtime) error {
			if err := rt.DecodeConfig(&cfg); err != nil {
				return err
			}
			if cfg.MaxSleep.Std() <= 0 {
				return &sdk.ConfigError{Attribute: "max_sleep", Message: "must be positive"}
			}
			rt.Logger.Info("configured", "greeting", cfg.Greeting)
			return nil
		},
		Health: func(ctx context.Context) sdk.Health {
			return sdk.Health{Status: sdk.StatusReady}
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// A Mux declares each route once, where its handler is registered: the
// host learns the routes from it and forwards only requests that match one,
// and the SDK serves each with the route's handler. Options mark a route
// streaming, give it its own deadline, or its own body limit.
func ExampleMux() {
	mux := sdk.NewMux()
	mux.HandleFunc("GET /items/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "item %s\n", r.PathValue("id"))
	})
	mux.HandleFunc("POST /items/", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}, sdk.Timeout(30*time.Second))
	mux.HandleFunc("PUT /items/{id}/image", func(w http.ResponseWriter, r *http.Request) {
		// Images are larger than the host's 1 MiB default.
		w.WriteHeader(http.StatusNoContent)
	}, sdk.MaxBody(8<<20))
	mux.HandleFunc("GET /events", func(w http.ResponseWriter, r *http.Request) {
		// Write and flush events until r.Context() ends.
	}, sdk.Streaming())

	for _, r := range mux.Routes() {
		fmt.Printf("%-24s streaming=%t timeout=%v max_body=%d\n", r, r.Streaming, r.Timeout, r.MaxBody)
	}
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/items/42", nil))
	fmt.Print(rec.Body)
	// Output:
	// GET /items/{id}          streaming=false timeout=0s max_body=0
	// POST /items/             streaming=false timeout=30s max_body=0
	// PUT /items/{id}/image    streaming=false timeout=0s max_body=8388608
	// GET /events              streaming=true timeout=0s max_body=0
	// item 42
}

// DecodeConfig fills a struct whose json tags name the schema's
// attributes. The host has applied defaults, so every attribute is present;
// one without a default is null when the operator omits it.
func ExampleRuntime_DecodeConfig() {
	type upstream struct {
		URL string `json:"url"`
	}
	type config struct {
		Greeting  string       `json:"greeting"`
		Timeout   sdk.Duration `json:"timeout"`
		Languages []string     `json:"languages"`
		Upstreams []upstream   `json:"upstream"`
	}
	p := sdk.Plugin{
		Name:    "hello",
		Version: "0.1.0",
		Routes:  sdk.NewMux(),
		Config: sdk.Schema{
			Attrs: []sdk.Attr{
				{Name: "greeting", Type: sdk.TypeString, Default: "hello"},
				{Name: "timeout", Type: sdk.TypeDuration, Default: "5s"},
				{Name: "languages", Type: sdk.ListOf(sdk.TypeString)},
			},
			Blocks: []sdk.Block{{
				Name:   "upstream",
				List:   true,
				Schema: sdk.Schema{Attrs: []sdk.Attr{{Name: "url", Type: sdk.TypeString, Required: true}}},
			}},
		},
		Configure: func(ctx context.Context, rt *sdk.Runtime) error {
			var cfg config
			if err := rt.DecodeConfig(&cfg); err != nil {
				return err
			}
			fmt.Printf("%s after %v to %d upstream(s); languages %q\n",
				cfg.Greeting, cfg.Timeout.Std(), len(cfg.Upstreams), cfg.Languages)
			return nil
		},
	}

	// What the host sends for
	//
	//	plugin "hello" "hello" {
	//	  greeting = "hi"
	//	  upstream { url = "http://10.0.0.1" }
	//	}
	block := `{"greeting":"hi","timeout":"5s","languages":null,"upstream":[{"url":"http://10.0.0.1"}]}`
	if err := sdk.ConfigureForExample(p, block); err != nil {
		fmt.Println(err)
	}

	// A field the struct does not declare means the struct and the schema
	// disagree; Configure fails and the host shows the error.
	err := sdk.ConfigureForExample(p, `{"greeting":"hi","colour":"red"}`)
	fmt.Println(err)
	// Output:
	// hi after 5s to 1 upstream(s); languages []
	// decode config: json: unknown field "colour"
}

// A ConfigError points the host's diagnostic at one attribute of the
// operator's config block.
func ExampleConfigError() {
	p := sdk.Plugin{
		Name:    "hello",
		Version: "0.1.0",
		Routes:  sdk.NewMux(),
		Config:  sdk.Schema{Attrs: []sdk.Attr{{Name: "port", Type: sdk.TypeNumber, Required: true}}},
		Configure: func(ctx context.Context, rt *sdk.Runtime) error {
			var cfg struct {
				Port int `json:"port"`
			}
			if err := rt.DecodeConfig(&cfg); err != nil {
				return err
			}
			if cfg.Port < 1 || cfg.Port > 65535 {
				return &sdk.ConfigError{Attribute: "port", Message: fmt.Sprintf("%d is not a TCP port", cfg.Port)}
			}
			return nil
		},
	}
	err := sdk.ConfigureForExample(p, `{"port":70000}`)
	var ce *sdk.ConfigError
	if errors.As(err, &ce) {
		fmt.Printf("attribute %s: %v\n", ce.Attribute, ce.Message)
	}
	// Output:
	// attribute port: 70000 is not a TCP port
}

// A ConfigChecker checks the values a schema cannot bound, each at its
// path, and keeps the first refusal for Configure to return.
func ExampleConfigChecker() {
	var cfg struct {
		Workers float64      `json:"workers"`
		Timeout sdk.Duration `json:"timeout"`
	}
	cfg.Workers, cfg.Timeout = 8, sdk.Duration(90*time.Second)

	var c sdk.ConfigChecker
	workers := c.Whole("workers", cfg.Workers, 1, 64)
	timeout := c.Duration("retry.timeout", cfg.Timeout, time.Millisecond, time.Minute)
	if c.Err() == nil && timeout > 10*time.Second*time.Duration(workers) {
		c.Refuse("retry.timeout", "must be at most 10s per worker, got %v", timeout)
	}
	fmt.Println(workers, timeout, c.Err())
	// Output:
	// 8 1ms retry.timeout: must be from 1ms to 1m0s, got 1m30s
}

// A block with Labels takes them in the operator's file after its name,
// and the plugin finds each in the block's JSON object under the label's
// name. A ConfigError's path names a labelled block by its labels, so the
// host points at that block's url, not at the config block.
func ExampleBlock_labels() {
	type upstream struct {
		Name string `json:"name"`
		URL  string `json:"url"`
	}
	p := sdk.Plugin{
		Name:    "proxy",
		Version: "0.1.0",
		Routes:  sdk.NewMux(),
		Config: sdk.Schema{Blocks: []sdk.Block{{
			Name:   "upstream",
			Labels: []string{"name"},
			List:   true,
			Schema: sdk.Schema{Attrs: []sdk.Attr{{Name: "url", Type: sdk.TypeString, Required: true}}},
		}}},
		Configure: func(ctx context.Context, rt *sdk.Runtime) error {
			var cfg struct {
				Upstreams []upstream `json:"upstream"`
			}
			if err := rt.DecodeConfig(&cfg); err != nil {
				return err
			}
			for _, u := range cfg.Upstreams {
				if !strings.HasPrefix(u.URL, "http://") {
					return &sdk.ConfigError{Attribute: fmt.Sprintf("upstream[%q].url", u.Name), Message: "must start with http://"}
				}
				fmt.Printf("upstream %s at %s\n", u.Name, u.URL)
			}
			return nil
		},
	}

	// What the host sends for
	//
	//	config {
	//	  upstream "primary" { url = "http://10.0.0.1" }
	//	  upstream "backup"  { url = "ftp://10.0.0.2" }
	//	}
	err := sdk.ConfigureForExample(p, `{"upstream":[{"name":"primary","url":"http://10.0.0.1"},{"name":"backup","url":"ftp://10.0.0.2"}]}`)
	fmt.Println(err)
	steps, _ := sdk.ParseConfigPath(err.(*sdk.ConfigError).Attribute)
	fmt.Printf("%+v\n", steps)
	// Output:
	// upstream primary at http://10.0.0.1
	// upstream["backup"].url: must start with http://
	// [{Name:upstream Labels:[backup] Index:0 Indexed:false} {Name:url Labels:[] Index:0 Indexed:false}]
}

// Attribute types compose from the scalar types with ListOf and MapOf.
func ExampleListOf() {
	schema := sdk.Schema{Attrs: []sdk.Attr{
		{Name: "hosts", Type: sdk.ListOf(sdk.TypeString), Default: []string{"localhost"}},
		{Name: "retries", Type: sdk.ListOf(sdk.TypeDuration)},
		{Name: "weights", Type: sdk.MapOf(sdk.TypeNumber)},
	}}
	var types []string
	for _, a := range schema.Attrs {
		types = append(types, a.Name+": "+string(a.Type))
	}
	fmt.Println(strings.Join(types, "\n"))
	// Output:
	// hosts: list(string)
	// retries: list(duration)
	// weights: map(number)
}

func ExampleHealthStatus_String() {
	fmt.Println(sdk.StatusReady, sdk.StatusDegraded, sdk.StatusNotReady)
	// Output: ready degraded not_ready
}
