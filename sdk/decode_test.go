package sdk_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/plughost/plughost/sdk"
)

type decoded struct {
	Name  string `json:"name"`
	Count int    `json:"count"`
}

func TestDecodeJSON(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want decoded
		// wantErr: "" for none, "trailing" for ErrTrailingData, "type"
		// for a *json.UnmarshalTypeError, else a part of the message.
		wantErr string
	}{
		{"object", `{"name":"a","count":2}`, decoded{"a", 2}, ""},
		{"white space after", "{\"name\":\"a\"}\n\t ", decoded{Name: "a"}, ""},
		{"unknown field", `{"name":"a","colour":"red"}`, decoded{}, `unknown field "colour"`},
		{"wrong type", `{"count":"two"}`, decoded{}, "type"},
		{"second object", `{"name":"a"}{"name":"b"}`, decoded{}, "trailing"},
		{"a byte after", `{"name":"a"}x`, decoded{}, "trailing"},
		{"a closing brace after", `{"name":"a"}}`, decoded{}, "trailing"},
		{"empty", ``, decoded{}, "EOF"},
		{"cut short", `{"name":"a"`, decoded{}, "unexpected EOF"},
		{"not an object", `[]`, decoded{}, "type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got decoded
			err := sdk.DecodeJSON(strings.NewReader(tt.in), &got)
			var te *json.UnmarshalTypeError
			switch {
			case tt.wantErr == "":
				if err != nil || got != tt.want {
					t.Errorf("DecodeJSON(%q) = %+v, %v; want %+v, nil", tt.in, got, err, tt.want)
				}
			case tt.wantErr == "trailing":
				if !errors.Is(err, sdk.ErrTrailingData) {
					t.Errorf("DecodeJSON(%q) = %v, want ErrTrailingData", tt.in, err)
				}
			case tt.wantErr == "type":
				if !errors.As(err, &te) {
					t.Errorf("DecodeJSON(%q) = %v, want a *json.UnmarshalTypeError", tt.in, err)
				}
			case err == nil || !strings.Contains(err.Error(), tt.wantErr) || errors.Is(err, sdk.ErrTrailingData):
				t.Errorf("DecodeJSON(%q) = %v, want an error containing %q", tt.in, err, tt.wantErr)
			}
		})
	}
}

// TestDecodeJSONBodyLimit: a body over its http.MaxBytesReader limit
// comes back as the reader's *http.MaxBytesError, for a 413.
func TestDecodeJSONBodyLimit(t *testing.T) {
	body := `{"name":"` + strings.Repeat("a", 100) + `"}`
	r := http.MaxBytesReader(httptest.NewRecorder(), io.NopCloser(strings.NewReader(body)), 50)
	var got decoded
	var mbe *http.MaxBytesError
	if err := sdk.DecodeJSON(r, &got); !errors.As(err, &mbe) {
		t.Errorf("DecodeJSON(a body over its limit) = %v, want a *http.MaxBytesError", err)
	}
}

// FuzzDecodeJSON: whatever DecodeJSON accepts is one valid JSON object
// with no member the struct lacks, and it decodes to what encoding/json
// decodes.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{"name":"a","count":1}`, `{} `, `{}{}`, `{"colour":1}`, `{"name":"a"}x`, `[1]`, ``, `{"name":"\u00e9"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var got decoded
		if sdk.DecodeJSON(bytes.NewReader(b), &got) != nil {
			return
		}
		if !json.Valid(b) {
			t.Fatalf("DecodeJSON(%q) accepted what is not one JSON value", b)
		}
		var members map[string]json.RawMessage
		if err := json.Unmarshal(b, &members); err != nil {
			t.Fatalf("DecodeJSON(%q) accepted what is not an object: %v", b, err)
		}
		var want decoded
		if err := json.Unmarshal(b, &want); err != nil || got != want {
			t.Fatalf("DecodeJSON(%q) = %+v, encoding/json %+v, %v", b, got, want, err)
		}
	})
}
