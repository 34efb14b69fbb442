# Every connection and stream limit set, none to its default.
limits {
  max_conns            = 50
  max_conns_per_ip     = 8
  max_streams_per_ip   = 4
  stream_write_timeout = "2s"
  stream_max_lifetime  = "1h"
  stream_buffer        = 16384
}

plugin "wallet" {
  path         = "wallet"
  max_inflight = 64
  max_streams  = 16
}
