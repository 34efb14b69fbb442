package main

import (
	"testing"

	"github.com/plughost/plughost/host/plugintest"
)

// TestConformance runs the SDK's conformance kit on the built binary. The
// in-flight request is a read waiting 300ms for a seq that never comes:
// it answers 200 with the current snapshot when its wait ends, or at once
// when the drain begins.
func TestConformance(t *testing.T) {
	plugintest.Conformance(t, plugintest.Build(t, "."), `committers = 2`,
		plugintest.InFlight("GET /v1/accounts/conformance?min_seq=18446744073709551615&wait=300ms"))
}
