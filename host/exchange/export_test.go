package exchange

import pluginv1 "github.com/plughost/plughost/proto/pluginv1"

// NewSize is New with n streams, for tests that need requests to share one.
func NewSize(rpc pluginv1.PluginClient, n int) *Pool { return newPool(rpc, n) }

// BreakStreams ends the pool's open streams, as a broken connection would.
func BreakStreams(p *Pool) {
	for i := range p.slots {
		if s := p.slots[i].cur.Load(); s != nil {
			s.cancel()
		}
	}
}
