// Command badproto speaks a plugin protocol version no host speaks, so the
// host must refuse it with an error naming both versions.
package main

import (
	"github.com/hashicorp/go-plugin"

	"github.com/plughost/plughost/sdk/wire"
)

func main() {
	hs := wire.Handshake
	hs.ProtocolVersion = 99
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: hs,
		VersionedPlugins: map[int]plugin.PluginSet{
			99: {wire.PluginKey: &wire.Plugin{}},
		},
		GRPCServer: plugin.DefaultGRPCServer,
	})
}
