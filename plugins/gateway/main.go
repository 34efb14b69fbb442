// Command gateway is the plughost gateway plugin: a tenant-fair front door
// before upstream services, which are other plugins of the same host or
// plain HTTP backends. Mounted where the operator chooses (/gw in the
// docs), it routes requests by path prefix to upstreams; it knows tenants
// by the SHA-256 of their X-Api-Key, holds each to a token bucket, queues
// their requests per tenant and serves the queues by deficit round-robin
// through a bounded pool of workers; it refuses decompression bombs
// before anything else runs, retries idempotent requests within their
// deadline, and stops calling a failing upstream with a circuit breaker.
// See docs/plugins/gateway.md.
package main

import (
	"fmt"
	"os"

	"github.com/plughost/plughost/sdk"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run serves the plugin until the host closes the connection.
func run() error {
	return sdk.Serve(definition())
}
