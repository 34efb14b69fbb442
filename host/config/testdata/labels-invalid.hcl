# Each marked block breaks one rule of labelled blocks (proxySchema);
# labels-invalid.golden pins the diagnostics.
plugin "proxy" {
  path = "proxy"
  config {
    upstream "wallet" {
      url = "http://127.0.0.1:7001"
    }
    upstream { # no label
      url = "http://127.0.0.1:7002"
    }
    upstream { # the label written as an argument
      name = "legacy"
      url  = "http://127.0.0.1:7000"
    }
    upstream "cache" "extra" { # one label too many
      url = "http://127.0.0.1:7003"
    }
    upstream "audit" {
      name = "audit" # the label also written as an argument
      url  = "http://127.0.0.1:7004"
    }
    upstream "wallet" { # a second upstream "wallet"
      url = "http://127.0.0.1:7005"
    }
    cert "server" { # one label too few
      file = "server.pem"
    }
    cert "server" "main" { file = "a.pem" }
    cert "client" "main" { file = "b.pem" }
    cert "server" "main" { file = "c.pem" } # a second cert "server" "main"
    tls {
      sni "a.example" { cert = "main" }
      sni "a.example" { cert = "other" } # a second sni "a.example"
    }
    route "/api/" {
      upstream = ["wallet"] # not a string
    }
    route "/api/" "v2" { # one label too many
      upstream = "wallet"
    }
    tls "strict" { # tls takes no label
    }
  }
}
