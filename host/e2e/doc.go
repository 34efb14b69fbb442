// Package e2e holds the end-to-end tests: they build the host and plugin
// binaries, run the host on config files as an operator would, and check
// its behaviour over real HTTP, real gRPC and real processes (including
// kill -9). It has no non-test code.
package e2e
