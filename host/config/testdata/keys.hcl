# Unknown keys, each with the suggestion the diagnostic makes.
listn        = "127.0.0.1:8080"
read_timeout = "1s"
faults       = true
colour       = "blue"

limits {
  max_body = 1024
  listen   = "127.0.0.1:8081"
}

admin {
  token = "secret"
}

plugin "hello" {
  path     = "hello"
  inflight = 8
  greeting = "hi"
}
