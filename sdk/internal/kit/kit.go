// Package kit lets the SDK's own test kit (sdk/plugintest) serve a plugin
// definition in-process through exactly the code path sdk.Serve uses,
// without adding that to the SDK's public surface. Package sdk fills the
// variable in its init function; nothing else may set it.
package kit

import (
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
)

// ServeConfig returns the go-plugin ServeConfig that sdk.Serve would use
// for def, which must be an sdk.Plugin, logging to logger. It returns the
// definition's validation error, if any.
var ServeConfig func(def any, logger hclog.Logger) (*plugin.ServeConfig, error)
