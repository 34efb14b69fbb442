package main

import (
	"testing"

	"github.com/plughost/plughost/host/plugintest"
)

func TestConformance(t *testing.T) {
	plugintest.Conformance(t, plugintest.Build(t, "."), `greeting = "hi"`,
		plugintest.InFlight("GET /sleep?ms=300"))
}
