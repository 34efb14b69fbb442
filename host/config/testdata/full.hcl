# Every attribute set, none to its default.
listen         = "0.0.0.0:8443"
data_dir       = "/var/lib/plughost"
plugin_dir     = "plugins"
drain_deadline = "30s"

admin {
  listen     = "127.0.0.1:9191"
  token_file = "secrets/admin.token"
}

limits {
  max_body_bytes  = 4096
  read_timeout    = "2s"
  write_timeout   = "3s"
  idle_timeout    = "90s"
  request_timeout = "1500ms"
  start_timeout   = "20s"
  body_timeout    = "4s"
}

restart {
  initial_backoff = "250ms"
  max_backoff     = "30s"
  max_restarts    = 0
  window          = "10m"
  stable_after    = "1m"
}

health {
  interval = "5s"
  timeout  = "5s"
  failures = 1
}

plugin "hello" {
  path         = "hello"
  sha256       = "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08"
  mount        = "/greet/hello"
  max_inflight = 8
  log_rate     = 50
  log_burst    = 100
  required     = false

  config {
    greeting = "hi"
    repeat   = 2
  }
}

plugin "kv_store-2" {
  path = "/opt/plughost/kv"
  # A degraded kv store takes the host out of the load balancer.
  unready_when_degraded = true
  env {
    GOGC       = "400"
    GOMEMLIMIT = "256MiB"
    EMPTY      = ""
  }
}
