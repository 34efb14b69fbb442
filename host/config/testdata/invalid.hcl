listen         = "localhost"
drain_deadline = "soon"
colour         = "blue"

limits {
  max_body_bytes = 0
}

plugin "Hello" {
  path = "hello"
}

plugin "a" {
  path   = "a"
  mount  = "/healthz/a"
  sha256 = "abc"
}

plugin "b" {
  path                  = "b"
  unready_when_degraded = "sometimes"
}
