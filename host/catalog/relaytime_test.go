package catalog

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/host/internal/testbin"
)

// TestRelayedRecordOneTimestamp: a plugin's record, relayed as go-plugin
// relays it (its fields, then the plugin's time as "timestamp"), carries
// the host's @timestamp only; a plugin's own field of that name that is
// not last stays.
func TestRelayedRecordOneTimestamp(t *testing.T) {
	buf := &testbin.SyncBuffer{}
	root := hclog.New(&hclog.LoggerOptions{Name: "plughost", Level: hclog.Trace, Output: buf, JSONFormat: true})
	limit := newLogLimiter(LogLimit{}, root, nil)
	l := goPluginLogger{Logger: root, words: &lastWords{}, limit: limit}
	relay := l.Named("hello").With("plugin", "hello")
	relay.Info("opened store", "path", "/data", "timestamp", "2026-11-26T23:00:00.000Z")
	relay.Warn("clock", "timestamp", "mine", "n", 1, "timestamp", "2026-11-26T23:00:00.000Z")

	var recs []map[string]any
	dec := json.NewDecoder(strings.NewReader(buf.String()))
	for dec.More() {
		var r map[string]any
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("decode %q: %v", buf.String(), err)
		}
		recs = append(recs, r)
	}
	if len(recs) != 2 {
		t.Fatalf("records = %v, want 2", recs)
	}
	for _, r := range recs {
		if _, ok := r["@timestamp"]; !ok {
			t.Errorf("record %v has no @timestamp", r)
		}
	}
	if ts, ok := recs[0]["timestamp"]; ok {
		t.Errorf("record %v has timestamp %v beside @timestamp, want only @timestamp", recs[0], ts)
	}
	if ts := recs[1]["timestamp"]; ts != "mine" {
		t.Errorf("record %v: timestamp = %v, want the plugin's own field \"mine\"", recs[1], ts)
	}
}
