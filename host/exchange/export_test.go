package exchange

import pluginv1 "github.com/plughost/plughost/proto/pluginv1"

// NewSize is New with n streams, for tests that need requests to share one.
func NewSize(rpc pluginv1.PluginClient, n int) *Pool { return newPool(rpc, n) }
