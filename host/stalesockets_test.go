package main

import (
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/host/catalog"
)

// TestLogStaleSockets: the host says it removed sockets a killed host
// left behind only for its own directories that held sockets.
func TestLogStaleSockets(t *testing.T) {
	const data = "/srv/plughost/data"
	tests := []struct {
		name    string
		removed []catalog.StaleSocketDir
		want    string // the info record, "" for none
	}{
		{name: "nothing removed"},
		{name: "another host's", removed: []catalog.StaleSocketDir{{Path: "/tmp/plughost-sockets-1", Owner: "/srv/other", Sockets: 2}}},
		{name: "a validate's", removed: []catalog.StaleSocketDir{{Path: "/tmp/plughost-sockets-1", Sockets: 1}}},
		{name: "ours without sockets", removed: []catalog.StaleSocketDir{{Path: "/tmp/plughost-sockets-1", Owner: data}}},
		{
			name: "ours with sockets",
			removed: []catalog.StaleSocketDir{
				{Path: "/tmp/plughost-sockets-1", Owner: data, Sockets: 2},
				{Path: "/tmp/plughost-sockets-2", Sockets: 1},
				{Path: "/tmp/plughost-sockets-3", Owner: data, Sockets: 1},
			},
			want: `removed plugin sockets a killed host left behind: sockets=3 dirs=["/tmp/plughost-sockets-1", "/tmp/plughost-sockets-3"]`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			logStaleSockets(hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: &b}), tt.removed, data)
			got := b.String()
			if tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
				t.Errorf("logStaleSockets(%+v) logged %q, want %q", tt.removed, got, tt.want)
			}
		})
	}
}
