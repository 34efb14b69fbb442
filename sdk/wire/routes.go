package wire

import (
	"time"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/route"
)

// RoutesToProto converts route declarations for Describe.
func RoutesToProto(rs []route.Route) []*pluginv1.Route {
	out := make([]*pluginv1.Route, 0, len(rs))
	for _, r := range rs {
		out = append(out, &pluginv1.Route{
			Method:       r.Method,
			Pattern:      r.Pattern,
			Streaming:    r.Streaming,
			TimeoutMs:    r.Timeout.Milliseconds(),
			NoBody:       r.NoBody,
			MaxBodyBytes: r.MaxBody,
		})
	}
	return out
}

// RoutesFromProto converts the routes a plugin declared in Describe. It
// checks nothing: route.Table.Add does.
func RoutesFromProto(rs []*pluginv1.Route) []route.Route {
	out := make([]route.Route, 0, len(rs))
	for _, r := range rs {
		out = append(out, route.Route{
			Method:    r.GetMethod(),
			Pattern:   r.GetPattern(),
			Streaming: r.GetStreaming(),
			Timeout:   time.Duration(r.GetTimeoutMs()) * time.Millisecond,
			NoBody:    r.GetNoBody(),
			MaxBody:   r.GetMaxBodyBytes(),
		})
	}
	return out
}
