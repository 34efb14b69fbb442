# Per-plugin body limits out of range: over the host's ceiling, zero,
# negative, and not a number.
limits {
  max_body_bytes = 4096
}

plugin "rewarder" {
  path           = "rewarder"
  max_body_bytes = 33554433
}

plugin "zero" {
  path           = "zero"
  max_body_bytes = 0
}

plugin "negative" {
  path           = "negative"
  max_body_bytes = -1
}

plugin "words" {
  path           = "words"
  max_body_bytes = "8 MiB"
}
