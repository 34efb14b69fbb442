# Per-plugin body limits: above and below the host-wide one, at the
# ceiling, and unset.
limits {
  max_body_bytes = 65536
}

plugin "rewarder" {
  path           = "rewarder"
  max_body_bytes = 8388608
}

plugin "small" {
  path           = "small"
  max_body_bytes = 1024
}

plugin "largest" {
  path           = "largest"
  max_body_bytes = 33554432
}

plugin "unset" {
  path = "unset"
}
