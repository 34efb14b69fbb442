// Command hello is the example plughost plugin: GET / answers the
// configured greeting and GET /sleep?ms=N answers after N milliseconds or
// when the request is cancelled. The benchmarks and end-to-end tests use it;
// the plugin guide walks through docs/examples/greeter.
package main

import (
	"fmt"
	"os"

	"github.com/plughost/plughost/sdk"
)

func main() {
	if err := sdk.Serve(definition()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
