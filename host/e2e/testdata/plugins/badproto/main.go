// Command badproto is a plugin as built for plugin protocol 1, before the
// data plane carried every request: the host must refuse it with an error
// naming both versions.
package main

import (
	"github.com/hashicorp/go-plugin"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/wire"
)

func main() {
	hs := wire.Handshake
	hs.ProtocolVersion = 1
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: hs,
		VersionedPlugins: map[int]plugin.PluginSet{
			// go-plugin registers the service before the handshake, so the
			// plugin needs a server even though no host will call it.
			1: {wire.PluginKey: &wire.GRPCPlugin{Impl: func(*plugin.GRPCBroker) pluginv1.PluginServer {
				return pluginv1.UnimplementedPluginServer{}
			}}},
		},
		GRPCServer: plugin.DefaultGRPCServer,
	})
}
