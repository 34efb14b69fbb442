// Package config owns the operator's HCL configuration file for the plughost
// host daemon: it parses the file, applies defaults, resolves paths and
// validates every value, reporting each problem as an hcl.Diagnostic that
// names the file, line and column at fault. It also decodes each plugin's
// config block against the schema that plugin declares in Describe.
//
// The package only reads the file it is given. It does not open listeners,
// read the admin token file, stat plugin binaries, check their hashes or start
// anything; those belong to the packages that act on a Config.
//
// A file, with every attribute at its default:
//
//	listen         = "127.0.0.1:8080"   # ingress address
//	data_dir       = "./data"           # each plugin gets data_dir/NAME
//	plugin_dir     = "./bin/plugins"    # plugin paths are relative to this unless absolute
//	drain_deadline = "5s"
//
//	admin {
//	  listen     = "127.0.0.1:9090"     # /metrics and the admin API
//	  token_file = ""                   # when set, the admin API requires "Authorization: Bearer <token>"
//	  hosts      = []                   # names the admin listener answers besides IP addresses and localhost
//	}
//	limits {
//	  max_body_bytes  = 1048576
//	  read_timeout    = "5s"
//	  write_timeout   = "5s"
//	  idle_timeout    = "60s"
//	  request_timeout = "5s"
//	  start_timeout   = "10s"
//	  body_timeout    = "10s"
//	  max_conns            = 10000      # ingress connections; more are answered 503 and closed
//	  max_conns_per_ip     = 2500       # a quarter of max_conns; 0: no cap
//	  max_streams_per_ip   = 0          # 0: no cap
//	  stream_write_timeout = "30s"      # a stream whose client reads nothing this long is cut
//	  stream_max_lifetime  = "30m"      # ±10%; "0": no limit
//	  stream_buffer        = 65536      # response credit per stream, in bytes
//	}
//	restart {
//	  initial_backoff = "100ms"
//	  max_backoff     = "5s"
//	  max_restarts    = 5
//	  window          = "1m"
//	  stable_after    = "10s"
//	}
//	health {
//	  interval = "2s"
//	  timeout  = "1s"
//	  failures = 3
//	}
//	debug {
//	  faults = false                    # POST /v1/plugins/NAME/faults allowed
//	}
//	plugin "hello" {                    # zero or more
//	  path         = "hello"            # required
//	  sha256       = ""
//	  mount        = "/hello"
//	  max_inflight = 512
//	  max_streams  = 1024               # streaming requests, outside max_inflight
//	  max_body_bytes = 1048576          # default limits.max_body_bytes; caps routes' sdk.MaxBody
//	  log_rate     = 200                # output records a second; 0: no limit
//	  log_burst    = 1000
//	  required     = true
//	  unready_when_degraded = false
//	  config {                          # checked later, against the plugin's schema
//	    greeting = "hello"
//	  }
//	}
//
// Every attribute and block is optional except a plugin's path. Expressions
// must be constants: the file has no variables and no functions. Relative
// data_dir, plugin_dir and admin.token_file resolve against the directory
// holding the config file; a relative plugin path resolves against plugin_dir.
//
// Before hcl/v2 parses a file, the package bounds its size (256 KiB), how
// deep it nests (128) and how deep its expressions chain (1024 tokens), so
// that no file can exhaust the parser's stack; a file beyond a bound gets
// one diagnostic at the token that crosses it.
//
// Loading a host configuration takes two steps, because a plugin's config
// schema is known only once the plugin runs:
//
//  1. [Load] (or [Parse]) checks everything but the plugin config blocks.
//  2. After the plugin answers Describe, [CheckSchema] vets the declared
//     schema and [DecodePluginConfig] decodes [PluginBlock.Config] against it into
//     the JSON that Configure carries, labelled blocks included.
//
// When the plugin's Configure refuses the config, [Locate] finds what its
// sdk.ConfigError names (upstream["wallet"].url) in the config block, so
// that the diagnostic points there.
//
// Print diagnostics from either step with [WriteDiagnostics] and
// [Config.Files].
package config
