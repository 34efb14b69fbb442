# Log limits out of range.
plugin "wallet" {
  path      = "wallet"
  log_rate  = -1
  log_burst = 0
}

plugin "hello" {
  path     = "hello"
  log_rate = "fast"
}
