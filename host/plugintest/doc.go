// Package plugintest is the test kit for plughost plugin authors.
//
// New serves a plugin definition in-process, over a real gRPC control plane
// and real data-plane socket pairs, through the same go-plugin and SDK code
// a plugin process runs, and returns a Harness that is an http.Handler:
// unit-test routes with net/http/httptest as if the plugin were mounted at
// "/". Requests go through the host's own ingress and data plane, so route
// matching, body caps, timeouts and error bodies are the host's. The
// harness decodes its config the way the host does, against the plugin's
// declared schema, and cleans up with t.Cleanup.
//
//	h := plugintest.New(t, definition(), plugintest.Options{Config: `greeting = "hi"`})
//	rec := httptest.NewRecorder()
//	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
//
// Conformance launches a built plugin binary through the host's own
// catalog and supervisor and checks, as named subtests, that the plugin is
// a good citizen of a plughost host: handshake, manifest, schema
// enforcement, health, robustness to malformed input, drain, exit and
// metrics. Each failure says what a good plugin does instead.
//
// Now is the clock a plugin's tests should take as the present: the wall
// clock moved by PLUGHOST_TEST_CLOCK_SHIFT (ClockShiftEnv). Give it to the
// code under test wherever that takes a clock, and run the suite once with
// the shift set a year ahead, as plughost's CI does, to find a fixture or a
// recorded time that would expire with the calendar before it does.
//
// The kit depends on the host's packages (catalog, supervisor, config,
// metrics) on purpose: it checks a plugin against the real host code, not a
// copy of it. Plugins import it only from tests.
package plugintest
