# A plugin config with labelled blocks, read by TestDecodeLabels against
# proxySchema: upstream and route take one label, cert two, and tls holds
# sni blocks labelled by host.
plugin "proxy" {
  path = "proxy"
  config {
    upstream "wallet" {
      url = "http://127.0.0.1:7001"
    }
    upstream "legacy" {
      url    = "http://127.0.0.1:7000"
      weight = 2
    }
    cert "server" "main" {
      file = "server.pem"
    }
    cert "client" "main" {
      file = "client.pem"
    }
    route "/api/" {
      upstream = "wallet"
    }
    tls {
      sni "a.example" {
        cert = "main"
      }
    }
  }
}
