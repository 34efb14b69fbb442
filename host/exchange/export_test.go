package exchange

import (
	"time"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

// NewSize is New with n streams, for tests that need requests to share one.
func NewSize(rpc pluginv1.PluginClient, n int) *Pool { return newPool(rpc, n) }

// BreakStreams ends the pool's open streams, as a broken connection would,
// and waits until the pool has noticed: the next requests open new ones.
func BreakStreams(p *Pool) {
	for i := range p.slots {
		if s := p.slots[i].cur.Load(); s != nil {
			s.cancel()
			s.mu.Lock()
			for s.calls != nil {
				s.mu.Unlock()
				time.Sleep(time.Millisecond)
				s.mu.Lock()
			}
			s.mu.Unlock()
		}
	}
}
