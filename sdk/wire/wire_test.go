package wire_test

import (
	"net/http"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestHeadersRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		in   http.Header
	}{
		{"nil", nil},
		{"empty", http.Header{}},
		{"one value", http.Header{"Content-Type": {"text/plain"}}},
		{"multiple values keep order", http.Header{"Set-Cookie": {"a=1", "b=2", "c=3"}}},
		{"several names", http.Header{"Accept": {"*/*"}, "X-Request-Id": {"r1"}, "Vary": {"Accept", "Origin"}}},
		{"empty value", http.Header{"X-Empty": {""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := http.Header{}
			wire.HeadersFromProto(got, wire.HeadersToProto(tt.in))
			want := tt.in
			if want == nil {
				want = http.Header{}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("HeadersFromProto(HeadersToProto(%v)) mismatch (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

func TestHeadersToProtoEmpty(t *testing.T) {
	for _, h := range []http.Header{nil, {}} {
		if got := wire.HeadersToProto(h); got != nil {
			t.Errorf("HeadersToProto(%v) = %v, want nil", h, got)
		}
	}
}

func TestHeadersFromProto(t *testing.T) {
	tests := []struct {
		name string
		dst  http.Header
		in   []*pluginv1.Header
		want http.Header
	}{
		{
			name: "canonicalises names",
			in:   []*pluginv1.Header{{Name: "content-type", Values: []string{"text/plain"}}, {Name: "X-REQUEST-ID", Values: []string{"r1"}}},
			want: http.Header{"Content-Type": {"text/plain"}, "X-Request-Id": {"r1"}},
		},
		{
			name: "merges names that canonicalise alike",
			in:   []*pluginv1.Header{{Name: "accept", Values: []string{"a"}}, {Name: "ACCEPT", Values: []string{"b", "c"}}},
			want: http.Header{"Accept": {"a", "b", "c"}},
		},
		{
			name: "appends to existing values",
			dst:  http.Header{"Vary": {"Origin"}, "Server": {"plughost"}},
			in:   []*pluginv1.Header{{Name: "vary", Values: []string{"Accept"}}},
			want: http.Header{"Vary": {"Origin", "Accept"}, "Server": {"plughost"}},
		},
		{
			name: "names net/http would not canonicalise stay as given",
			in:   []*pluginv1.Header{{Name: "x header", Values: []string{"v"}}},
			want: http.Header{"x header": {"v"}},
		},
	}
	for _, conv := range []struct {
		name string
		fn   func(http.Header, []*pluginv1.Header)
	}{{"HeadersFromProto", wire.HeadersFromProto}, {"AdoptHeaders", wire.AdoptHeaders}} {
		for _, tt := range tests {
			t.Run(conv.name+"/"+tt.name, func(t *testing.T) {
				got := http.Header{}
				for k, v := range tt.dst {
					got[k] = slices.Clip(slices.Clone(v))
				}
				conv.fn(got, tt.in)
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("%s(%v) mismatch (-want +got):\n%s", conv.name, tt.in, diff)
				}
			})
		}
	}
}

// TestAdoptHeadersCapped checks that appending to an adopted header
// leaves the wire header's spare capacity alone.
func TestAdoptHeadersCapped(t *testing.T) {
	vals := make([]string, 1, 2)
	vals[0] = "1"
	in := []*pluginv1.Header{{Name: "X-A", Values: vals}}
	got := http.Header{}
	wire.AdoptHeaders(got, in)
	got.Add("X-A", "2")
	if v := vals[:2][1]; v != "" {
		t.Errorf("after adding to the adopted header, the wire header's spare capacity holds %q, want nothing", v)
	}
	if want := []string{"1", "2"}; !slices.Equal(got["X-A"], want) {
		t.Errorf("adopted header after Add = %q, want %q", got["X-A"], want)
	}
}

// Entries without values come from senders that are not net/http; they must
// not panic and must not produce values.
func TestHeadersFromProtoNoValues(t *testing.T) {
	in := []*pluginv1.Header{nil, {Name: "x-none"}, {Name: "x-empty", Values: []string{}}, {Name: "content-type"}}
	for name, from := range map[string]func(http.Header, []*pluginv1.Header){"HeadersFromProto": wire.HeadersFromProto, "AdoptHeaders": wire.AdoptHeaders} {
		got := http.Header{}
		from(got, in)
		for k, v := range got {
			if len(v) != 0 {
				t.Errorf("%s(%v)[%q] = %q, want no values", name, in, k, v)
			}
		}
		// A name without values is net/http's "no Content-Type, do not
		// sniff one": it must survive the trip, not vanish.
		if _, ok := got["Content-Type"]; !ok {
			t.Errorf("%s(%v) has no Content-Type, want it present without values", name, in)
		}
	}
}

func TestHeadersFromProtoDoesNotAlias(t *testing.T) {
	in := []*pluginv1.Header{{Name: "X-A", Values: []string{"1", "2"}}}
	got := http.Header{}
	wire.HeadersFromProto(got, in)
	got["X-A"][0] = "changed"
	if v := in[0].Values[0]; v != "1" {
		t.Errorf("after changing the decoded header, wire value = %q, want %q", v, "1")
	}
}

func TestPluginSets(t *testing.T) {
	sets := wire.PluginSets(nil)
	set, ok := sets[wire.ProtocolVersion]
	if !ok {
		t.Fatalf("PluginSets(nil) has no set for protocol %d", wire.ProtocolVersion)
	}
	if _, ok := set[wire.PluginKey].(*wire.GRPCPlugin); !ok {
		t.Errorf("PluginSets(nil)[%d][%q] = %T, want *wire.Plugin", wire.ProtocolVersion, wire.PluginKey, set[wire.PluginKey])
	}
}
