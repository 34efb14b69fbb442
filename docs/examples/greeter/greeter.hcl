# The plugin block that runs greeter: add it to the host's config.hcl once
# the binary is in plugin_dir.
plugin "greeter" {
  path  = "greeter"  # relative to plugin_dir
  mount = "/greeter" # the default: "/" and the block's label
  config {
    greeting      = "hi"
    max_name_len  = 32
    max_greetings = 1000
    cooldown      = "10s"
  }
}
