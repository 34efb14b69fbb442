// Command badproto speaks a plugin protocol version no host speaks, so the
// host must refuse it with an error naming both versions.
package main

import (
	"github.com/hashicorp/go-plugin"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/wire"
)

func main() {
	hs := wire.Handshake
	hs.ProtocolVersion = 99
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: hs,
		VersionedPlugins: map[int]plugin.PluginSet{
			// go-plugin registers the service before the handshake, so the
			// plugin needs a server even though no host will call it.
			99: {wire.PluginKey: &wire.Plugin{Impl: func(*plugin.GRPCBroker) pluginv1.PluginServer {
				return pluginv1.UnimplementedPluginServer{}
			}}},
		},
		GRPCServer: plugin.DefaultGRPCServer,
	})
}
