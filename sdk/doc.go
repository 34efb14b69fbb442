// Package sdk is what a third party imports to write a plughost plugin.
//
// A plugin is a separately built binary that the plughost host daemon starts,
// configures, routes HTTP requests to, health-checks, drains and restarts.
// Its main function describes the plugin and calls Serve:
//
//	func main() {
//		h := &hello{}
//		mux := sdk.NewMux()
//		mux.HandleFunc("GET /{$}", h.greet)
//		mux.HandleFunc("GET /events", h.events, sdk.Streaming())
//		if err := sdk.Serve(sdk.Plugin{
//			Name:    "hello",
//			Version: "0.1.0",
//			Routes:  mux,
//			Config: sdk.Schema{Attrs: []sdk.Attr{
//				{Name: "greeting", Type: sdk.TypeString, Default: "hello"},
//			}},
//			Configure: h.configure,
//		}); err != nil {
//			fmt.Fprintln(os.Stderr, err)
//			os.Exit(1)
//		}
//	}
//
// A route is declared once, where its handler is registered on the Mux,
// with net/http ServeMux patterns relative to the plugin's mount point.
// Describe reports the Mux's routes to the host, which forwards only
// requests that match one of them, matching them with the same route.Table
// the Mux dispatches with. Streaming and Timeout set a route's options.
//
// The lifecycle of one plugin process, in order:
//
//  1. Describe: the host reads the Plugin's name, version, routes and config
//     schema. `plughost validate` stops here.
//  2. Configure: the host decodes the operator's config block against the
//     schema and calls the Configure hook with a *Runtime carrying the
//     config, a logger, a prometheus.Registerer, the data directory and a
//     Host to call other plugins. A returned error is shown to the operator
//     as a config diagnostic.
//  3. Serve: the Mux serves requests. Paths are relative to the plugin's
//     mount point: a plugin mounted at /hello sees GET /hello/sleep as
//     GET /sleep. Each request's context carries the caller's deadline and
//     is cancelled when the caller goes away. A panic in a handler becomes a
//     500 for that request (or, once a streamed response has been flushed,
//     cuts it short) and is logged with its stack; the plugin keeps
//     serving.
//  4. Drain: the host asks the plugin to stop. New requests get 503 with
//     Retry-After, Runtime.Context is cancelled, the Drain hook runs and the
//     SDK waits for in-flight requests until the host's deadline.
//  5. Exit: the host closes the connection, or the process notices that its
//     host is gone and exits by itself.
//
// The public surface uses only standard and SDK types; the protobuf
// contract stays behind unexported adapters.
package sdk
