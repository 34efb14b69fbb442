# plughost configuration: `make run` runs the host on this file.
# Every key, its default and its meaning: docs/config.md.
listen         = "127.0.0.1:8080"
data_dir       = "./data"
plugin_dir     = "./bin/plugins"
drain_deadline = "5s"

admin {
  listen     = "127.0.0.1:9090"
  token_file = ""
}

limits {
  max_body_bytes  = 1048576
  read_timeout    = "5s"
  write_timeout   = "5s"
  idle_timeout    = "60s"
  request_timeout = "5s"
}

restart {
  initial_backoff = "100ms"
  max_backoff     = "5s"
  max_restarts    = 5
  window          = "1m"
}

health {
  interval = "2s"
  timeout  = "1s"
  failures = 3
}

plugin "hello" {
  path         = "hello"
  mount        = "/hello"
  max_inflight = 512
  required     = true
  # A request leaves almost nothing on hello's small heap, so Go's default
  # GC target collects often under load; 200 halves that (docs/plugins/hello.md).
  env {
    GOGC = "200"
  }
  config {
    greeting = "hello"
  }
}

# The wallet (docs/plugins/wallet.md): every value in its config block is
# its documented default. Its ledger is data_dir/wallet/wallet.db.
plugin "wallet" {
  path         = "wallet"
  mount        = "/wallet"
  max_inflight = 512
  required     = true
  # Its commits allocate much per operation over a small live heap, so it
  # collects less often (docs/plugins/wallet.md, Performance).
  env {
    GOGC = "800"
  }
  config {
    queue_capacity   = 512
    committers       = 0 # 0 means the number of CPUs
    max_batch        = 256
    commit_timeout   = "1s"
    idempotency_ttl  = "24h"
    staleness_window = "250ms"
    events_buffer    = 1024
    breaker {
      failures  = 20
      cool_down = "5s"
      probes    = 10
    }
  }
}
