// Package wire is the glue the host and the SDK share: the go-plugin
// handshake and plugin set (the gRPC control plane), the data plane's
// framing (Conn) and the conversions between net/http values and the
// plughost.plugin.v1 protobuf contract.
//
// Plugin authors never import it; the sdk package hides it behind standard
// types. It must not depend on the host or on any plugin.
package wire

import (
	"context"
	"net/http"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

// ProtocolVersion is the plugin protocol this build speaks. It is carried in
// the go-plugin handshake; history is kept in proto/pluginv1/plugin.proto.
const ProtocolVersion = 2

// MaxMessageBytes bounds one gRPC message between host and plugin in both
// directions (a Host.Call with its body and answer, a metrics scrape) and
// one data-plane frame. gRPC's default of 4 MiB is too small for the
// first.
const MaxMessageBytes = 64 << 20

// PluginKey names the single plugin kind in the go-plugin plugin set.
const PluginKey = "service"

// Handshake is the go-plugin handshake. The magic cookie only stops a plugin
// binary from being run by hand by mistake; it is not a security measure.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "PLUGHOST_PLUGIN",
	MagicCookieValue: "6b1d4f0c-plughost-service-plugin",
}

// ServeInProcess returns the go-plugin ServeConfig that sdk.Serve would
// use for def, which must be an sdk.Plugin, logging to logger and serving
// data as its data-plane connections; it returns the definition's
// validation error, if any. Package sdk sets it when it is initialised, so
// that the test kit (host/plugintest) serves a plugin in-process through
// exactly the code path a plugin process runs. Nothing else may set or
// call it.
var ServeInProcess func(def any, logger hclog.Logger, data []*Conn) (*plugin.ServeConfig, error)

// Client is what the host gets from go-plugin for a running plugin.
type Client struct {
	pluginv1.PluginClient
	// Broker carries the Host service the host serves to the plugin.
	Broker *plugin.GRPCBroker
	// Exited is cancelled by go-plugin when the plugin process exits.
	Exited context.Context
}

// GRPCPlugin implements plugin.GRPCPlugin for both sides of the connection.
type GRPCPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	// Impl builds the plugin-side server; it is nil in the host.
	Impl func(broker *plugin.GRPCBroker) pluginv1.PluginServer
}

// GRPCServer registers the plugin service; go-plugin calls it in the plugin.
func (p *GRPCPlugin) GRPCServer(broker *plugin.GRPCBroker, s *grpc.Server) error {
	pluginv1.RegisterPluginServer(s, p.Impl(broker))
	return nil
}

// GRPCClient returns a *Client; go-plugin calls it in the host.
func (p *GRPCPlugin) GRPCClient(ctx context.Context, broker *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return &Client{PluginClient: pluginv1.NewPluginClient(c), Broker: broker, Exited: ctx}, nil
}

// PluginSets returns the versioned plugin sets for go-plugin's client and
// server configs. impl is nil on the host side.
func PluginSets(impl func(*plugin.GRPCBroker) pluginv1.PluginServer) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		ProtocolVersion: {PluginKey: &GRPCPlugin{Impl: impl}},
	}
}

// smallHeaders is how many header names, and values, HeadersToProto and
// the frame decoder keep in one block, which the decoder makes a part of
// the frame's.
const smallHeaders = 2

// HeadersToProto converts an http.Header. The messages share h's value
// slices.
func HeadersToProto(h http.Header) []*pluginv1.Header {
	if len(h) == 0 || len(h) > smallHeaders {
		return headersToProto(h, nil)
	}
	// One allocation for the messages and the pointers of up to
	// smallHeaders names, which is most requests' and responses', and two
	// beyond, rather than one per header.
	return headersToProto(h, new(HeaderMessages))
}

// HeaderMessages holds the messages of up to smallHeaders headers, so that
// a caller that converts headers for every request can make them a part
// of an allocation it makes anyway.
type HeaderMessages struct {
	msgs [smallHeaders]pluginv1.Header
	ptrs [smallHeaders]*pluginv1.Header
}

// Convert is HeadersToProto, its messages in m when h has up to
// smallHeaders names: they hold until the next Convert.
func (m *HeaderMessages) Convert(h http.Header) []*pluginv1.Header { return headersToProto(h, m) }

// headersToProto converts h into m, if it fits, or new blocks.
func headersToProto(h http.Header, m *HeaderMessages) []*pluginv1.Header {
	if len(h) == 0 {
		return nil
	}
	var msgs []pluginv1.Header
	var out []*pluginv1.Header
	if m != nil && len(h) <= smallHeaders {
		msgs, out = m.msgs[:len(h)], m.ptrs[:0:len(h)]
	} else {
		msgs, out = make([]pluginv1.Header, len(h)), make([]*pluginv1.Header, 0, len(h))
	}
	for k, v := range h {
		m := &msgs[len(out)]
		m.Name, m.Values = k, v
		out = append(out, m)
	}
	return out
}

// HeadersFromProto converts wire headers into dst, which must not be nil.
// Names are canonicalised as net/http would. The values are copied.
func HeadersFromProto(dst http.Header, hs []*pluginv1.Header) {
	headersFromProto(dst, hs, false)
}

// AdoptHeaders is HeadersFromProto for headers that nothing uses after
// it, such as a frame's from Conn.Recv: dst takes their value slices,
// each capped so that an append to it copies, rather than copies of them.
func AdoptHeaders(dst http.Header, hs []*pluginv1.Header) {
	headersFromProto(dst, hs, true)
}

func headersFromProto(dst http.Header, hs []*pluginv1.Header, adopt bool) {
	var vals []string
	if !adopt {
		n := 0
		for _, h := range hs {
			n += len(h.GetValues())
		}
		// One backing array for the values of every name new to dst,
		// each name capped to its own part so that appending to it
		// copies.
		vals = make([]string, 0, n)
	}
	for _, h := range hs {
		k := http.CanonicalHeaderKey(h.GetName())
		v := h.GetValues()
		if old, ok := dst[k]; ok || len(v) == 0 {
			dst[k] = append(old, v...)
			continue
		}
		if adopt {
			dst[k] = v[:len(v):len(v)]
			continue
		}
		i := len(vals)
		vals = append(vals, v...)
		dst[k] = vals[i:len(vals):len(vals)]
	}
}
