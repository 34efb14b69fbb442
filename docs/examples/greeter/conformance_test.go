package main

import (
	"testing"

	"github.com/plughost/plughost/host/plugintest"
)

func TestConformance(t *testing.T) {
	plugintest.Conformance(t, plugintest.Build(t, "."), `greeting = "hi"`,
		plugintest.InFlight("GET /slow?ms=300"))
}
