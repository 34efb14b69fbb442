// Command legacy is a plugin for the tests that speaks plugin protocol 1 as
// a plugin built before Exchange was added does: it serves Handle, and its
// Exchange answers Unimplemented, as the generated code does for any method
// a server does not implement. It uses go-plugin and the wire package
// directly, since every SDK plugin now serves Exchange.
//
//	GET /          answers 200 "legacy"
//	GET /sleep?ms=N answers after N ms or when the request is cancelled
package main

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/hashicorp/go-plugin"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/wire"
)

func main() {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: wire.Handshake,
		VersionedPlugins: wire.PluginSets(func(*plugin.GRPCBroker) pluginv1.PluginServer {
			return legacy{}
		}),
		GRPCServer: plugin.DefaultGRPCServer,
	})
}

type legacy struct {
	pluginv1.UnimplementedPluginServer
}

func (legacy) Describe(context.Context, *pluginv1.DescribeRequest) (*pluginv1.DescribeResponse, error) {
	return &pluginv1.DescribeResponse{
		Name:    "legacy",
		Version: "0.0.1",
		Routes: []*pluginv1.Route{
			{Method: http.MethodGet, Pattern: "/{$}"},
			{Method: http.MethodGet, Pattern: "/sleep"},
		},
	}, nil
}

func (legacy) Configure(context.Context, *pluginv1.ConfigureRequest) (*pluginv1.ConfigureResponse, error) {
	return &pluginv1.ConfigureResponse{}, nil
}

func (legacy) Health(context.Context, *pluginv1.HealthRequest) (*pluginv1.HealthResponse, error) {
	return &pluginv1.HealthResponse{Status: pluginv1.HealthResponse_STATUS_READY}, nil
}

func (legacy) Drain(context.Context, *pluginv1.DrainRequest) (*pluginv1.DrainResponse, error) {
	return &pluginv1.DrainResponse{}, nil
}

func (legacy) Handle(ctx context.Context, req *pluginv1.HTTPRequest) (*pluginv1.HTTPResponse, error) {
	if req.GetPath() == "/sleep" {
		q, _ := url.ParseQuery(req.GetRawQuery())
		ms, _ := strconv.Atoi(q.Get("ms"))
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &pluginv1.HTTPResponse{
		Status:  http.StatusOK,
		Headers: []*pluginv1.Header{{Name: "Content-Type", Values: []string{"text/plain"}}},
		Body:    []byte("legacy"),
	}, nil
}
