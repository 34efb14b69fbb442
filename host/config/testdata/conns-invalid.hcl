# Connection and stream limits out of range.
limits {
  max_conns            = 0
  max_conns_per_ip     = -1
  max_streams_per_ip   = -1
  stream_write_timeout = "0s"
  stream_max_lifetime  = "-1m"
  stream_buffer        = 1048576
}

plugin "wallet" {
  path        = "wallet"
  max_streams = 0
}

plugin "hello" {
  path                = "hello"
  stream_max_lifetime = "0"
}
