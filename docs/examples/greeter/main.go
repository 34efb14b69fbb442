// Command greeter is an example plughost plugin that lives in its own Go
// module and uses nothing of plughost but its SDK.
//
// GET / answers the configured greeting, GET /greet/{name} greets a name,
// POST /greetings stores a custom greeting for a name, and GET /slow?ms=N
// answers after N milliseconds (the conformance kit holds it in flight
// while it drains the plugin). Custom greetings are kept in memory, saved
// to the plugin's data directory when the host drains it and loaded again
// when it starts.
//
// The plugin guide, docs/plugin-guide.md in the plughost repository,
// walks through this code.
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
