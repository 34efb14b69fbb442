GO        ?= go
BIN       := bin
PLUGINS   := $(notdir $(wildcard plugins/*))
PROTO_SRC := $(wildcard proto/*/*.proto)
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
# CONFIG is the config file make run runs the host on: make run CONFIG=other.hcl.
CONFIG    ?= config.hcl

.PHONY: all build run test bench bench-peers proto clean

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/plughost ./host
	@for p in $(PLUGINS); do \
		echo "$(GO) build -o $(BIN)/plugins/$$p ./plugins/$$p"; \
		$(GO) build -o $(BIN)/plugins/$$p ./plugins/$$p || exit 1; \
	done

run: build
	$(BIN)/plughost run -config $(CONFIG)

# test also checks docs/examples/greeter, a module of its own that ./... does
# not enter, and the alert rules in docs/deploy with promtool where it is
# installed (.ci/run installs it). Every step runs even when one before it failed, so that one
# run shows every failure; test fails if any step did. Set
# PLUGHOST_TEST_CLOCK_SHIFT (a Go duration, such as 8760h) to run the tests
# that read host/plugintest.Now (the wallet's) on a clock that far ahead.
test:
	@status=0; \
	step() { echo "$$*"; "$$@" || { status=1; echo "FAILED: $$*"; }; }; \
	gofmt_clean() { out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		[ -z "$$out" ] || { echo "gofmt needed:"; echo "$$out"; return 1; }; }; \
	step gofmt_clean; \
	step $(GO) vet ./...; \
	step $(GO) test -race -count=1 -timeout 20m ./...; \
	if command -v promtool >/dev/null; then \
		step promtool check rules docs/deploy/alerts.yml; \
		step promtool test rules docs/deploy/alerts_test.yml; \
	elif [ "$$CI" = true ]; then \
		echo "FAILED: promtool not installed; .ci/run installs Debian's prometheus"; status=1; \
	else \
		echo "promtool not installed (Debian's prometheus): skipping the checks of docs/deploy/alerts.yml"; \
	fi; \
	if step cd docs/examples/greeter; then \
		step $(GO) vet ./...; \
		step $(GO) test -race -count=1 -timeout 10m ./...; \
	fi; \
	exit $$status

# bench runs the end-to-end benchmarks (the gateway's against its upstream
# reached directly, target at least 0.6), then the store's first-key Ascend
# with writes pending against none (pending/empty, target at most 2), then
# the durable kit's against the raw store at the same group size (kit/raw,
# target at least 0.7), then the registry's inclusion proofs in a log of a
# million entries, in-process (p99 target at most 2 ms).
bench: build
	$(GO) test -run '^$$' -bench '^Benchmark(HelloIngress|WalletTransfers|Mailbox|Registry|Rewarder|Reload|PluginLogFlood|Gateway|GatewayNoisyNeighbour)$$' -benchtime 1x -count 1 -timeout 10m ./host/e2e
	$(GO) test -run '^$$' -bench '^BenchmarkAscendFirst$$' -count 1 -timeout 5m ./sdk/store
	$(GO) test -run '^$$' -bench '^BenchmarkCommitter$$' -benchtime 1x -count 1 -timeout 5m ./sdk/durable
	$(GO) test -run '^$$' -bench '^BenchmarkInclusionProof$$' -benchtime 1x -count 1 -timeout 5m ./plugins/registry

# bench-peers runs BenchmarkPeers: the same wrk load through the host to
# its hello plugin, through nginx and HAProxy to a standalone Go server of
# the same handler, and on that server directly, in alternating rounds,
# with the host's ratios to nginx and HAProxy and the machine's steal.
# Installs wrk, nginx and HAProxy from Debian's packages when missing.
bench-peers:
	@missing=""; for t in wrk nginx haproxy; do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
		echo "apt-get install -y$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq$$missing; \
	fi
	$(GO) test -run '^$$' -bench '^BenchmarkPeers$$' -benchtime 1x -count 1 -timeout 10m ./host/e2e

# proto regenerates the committed gRPC code. Needs protoc (Debian's
# protobuf-compiler); installs the Go generators at pinned versions.
proto:
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.11
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	PATH="$$($(GO) env GOPATH)/bin:$$PATH" protoc --go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative $(PROTO_SRC)

clean:
	rm -rf $(BIN)
