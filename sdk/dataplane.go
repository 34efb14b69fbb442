package sdk

import "github.com/plughost/plughost/sdk/wire"

// inherited holds the data-plane connections the host passed this process
// (see "Data plane" in proto/pluginv1/plugin.proto), taken over when the
// package is initialised, before the plugin's main package is: no child
// process the plugin starts, even from an init function of its own, may
// inherit them. err says why there are none when the host passed some.
var inherited struct {
	conns []*wire.Conn
	err   error
}

func init() { inherited.conns, inherited.err = takeDataPlane() }
