package sdk_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/plughost/plughost/sdk"
)

func TestWriteError(t *testing.T) {
	tests := []struct {
		name        string
		status      int
		code, msg   string
		retryAfter  string // set by the handler before
		wantBody    string
		wantRetryAt string
	}{
		{"not found", 404, "not_found", "no such item", "", `{"error":{"code":"not_found","message":"no such item"}}` + "\n", ""},
		{"busy", 429, "busy", "try later", "", `{"error":{"code":"busy","message":"try later"}}` + "\n", "1"},
		{"draining", 503, "draining", "bye", "", `{"error":{"code":"draining","message":"bye"}}` + "\n", "1"},
		{"own retry-after", 503, "ledger_unavailable", "wait", "7", `{"error":{"code":"ledger_unavailable","message":"wait"}}` + "\n", "7"},
		{"escaped", 400, "bad_request", "a \"quote\", <tag> & \x01", "", `{"error":{"code":"bad_request","message":"a \"quote\", \u003ctag\u003e \u0026 \u0001"}}` + "\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			if tt.retryAfter != "" {
				rec.Header().Set("Retry-After", tt.retryAfter)
			}
			sdk.WriteError(rec, tt.status, tt.code, tt.msg)
			if rec.Code != tt.status || rec.Body.String() != tt.wantBody {
				t.Errorf("WriteError(%d, %q, %q) = %d %q, want %d %q", tt.status, tt.code, tt.msg, rec.Code, rec.Body, tt.status, tt.wantBody)
			}
			h := rec.Header()
			if h.Get("Content-Type") != "application/json" || h.Get("Retry-After") != tt.wantRetryAt {
				t.Errorf("WriteError(%d) headers = %v, want JSON and Retry-After %q", tt.status, h, tt.wantRetryAt)
			}
			if !json.Valid(rec.Body.Bytes()) {
				t.Errorf("WriteError body %q is not JSON", rec.Body)
			}
		})
	}
}

func TestErrorBodyExtra(t *testing.T) {
	n := uint64(5)
	type nonce struct {
		ExpectedNonce *uint64 `json:"expected_nonce,omitempty"`
	}
	tests := []struct {
		name  string
		extra any
		want  string
	}{
		{"nil", nil, `{"error":{"code":"c","message":"m"}}`},
		{"members", nonce{&n}, `{"error":{"code":"c","message":"m","expected_nonce":5}}`},
		{"omitted", nonce{}, `{"error":{"code":"c","message":"m"}}`},
		{"not an object", []int{1}, `{"error":{"code":"c","message":"m"}}`},
		{"unencodable", func() {}, `{"error":{"code":"c","message":"m"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(sdk.ErrorBody("c", "m", tt.extra)); got != tt.want+"\n" {
				t.Errorf("ErrorBody(c, m, %#v) = %q, want %q", tt.extra, got, tt.want+"\n")
			}
		})
	}
}

// WriteError is the one writer of the platform's error body; a plugin
// maps its errors to a status and a code in one place and answers with it.
func ExampleWriteError() {
	rec := httptest.NewRecorder()
	sdk.WriteError(rec, http.StatusServiceUnavailable, "draining", "retry on another instance")
	fmt.Print(rec.Code, " ", rec.Header().Get("Retry-After"), " ", rec.Body)
	// Output: 503 1 {"error":{"code":"draining","message":"retry on another instance"}}
}
