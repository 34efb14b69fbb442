# Mistakes in plugin env blocks.
plugin "a" {
  path = "a"
  env {
    GOGC             = 800
    gogc             = "800"
    GOMAXPROC        = "2"
    GOOS             = "linux"
    GOMEMLIMIT       = ["1GiB"]
    PLUGIN_MIN_PORT  = "1"
    PLUGHOST_PLUGIN  = "x"
    MY-VAR           = "x"
  }
}
