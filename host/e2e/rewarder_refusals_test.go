package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestRewarderRefusals sends bad computes through the real host and
// rewarder binary: malformed or out-of-range inputs are 400 naming the
// field, before anything is sealed; the same epoch with other inputs
// than the sealed ones is 409; the same inputs again are answered as the
// epoch stands, never a second run.
func TestRewarderRefusals(t *testing.T) {
	h := startHost(t, baseConfig("5s")+rewarderWallet()+pluginBlock("rewarder", "rewarder", "  max_body_bytes = 1048576\n  config {\n  }"))
	readyPlugin(t, h, "rewarder")
	post := func(epoch, body string) (int, string) {
		return do(t, "POST", h.ingress+"/rewarder/v1/epochs/"+epoch+"/compute", strings.NewReader(body), http.Header{"Content-Type": {"application/json"}})
	}
	field := func(body string) string {
		var e struct {
			Error struct {
				Code  string `json:"code"`
				Field string `json:"field"`
			} `json:"error"`
		}
		if json.Unmarshal([]byte(body), &e) != nil || e.Error.Code != "bad_request" {
			return ""
		}
		return e.Error.Field
	}
	for _, tt := range []struct {
		name, epoch, body, field string
	}{
		{"not JSON", "r1", `{"pool_account":`, "body"},
		{"an unknown field", "r1", `{"pool_account":"pool","pool_amount":10,"contributions":[{"account":"x","weight":1}],"extra":1}`, "body"},
		{"a pool amount of 0", "r1", `{"pool_account":"pool","pool_amount":0,"contributions":[{"account":"x","weight":1}]}`, "pool_amount"},
		{"a weight of 0", "r1", `{"pool_account":"pool","pool_amount":10,"contributions":[{"account":"x","weight":1},{"account":"y","weight":0}]}`, "contributions[1].weight"},
		{"an account id of 129 bytes", "r1", `{"pool_account":"pool","pool_amount":10,"contributions":[{"account":"` + strings.Repeat("a", 129) + `","weight":1}]}`, "contributions[0].account"},
		{"the pool paying itself", "r1", `{"pool_account":"pool","pool_amount":10,"contributions":[{"account":"pool","weight":1}]}`, "contributions[0].account"},
		{"a bad epoch id", "r%20one", rewarderInputs("r", 10, 2), "epoch"},
	} {
		code, body := post(tt.epoch, tt.body)
		if code != http.StatusBadRequest || field(body) != tt.field {
			t.Errorf("%s = %d %s, want 400 naming %s", tt.name, code, body, tt.field)
		}
	}
	// Nothing was sealed by the refusals: r1 takes its first inputs.
	code, body := post("r1", rewarderInputs("r", 1000, 3))
	if code != http.StatusAccepted {
		t.Fatalf("the first compute of r1 = %d %s, want 202", code, body)
	}
	if code, body := post("r1", rewarderInputs("r", 1001, 3)); code != http.StatusConflict {
		t.Errorf("r1 with another pool amount = %d %s, want 409", code, body)
	}
	if code, body := post("r1", rewarderInputs("q", 1000, 3)); code != http.StatusConflict {
		t.Errorf("r1 with other recipients = %d %s, want 409", code, body)
	}
	if code, body := post("r1", rewarderInputs("r", 1000, 3)); code != http.StatusAccepted && code != http.StatusOK {
		t.Errorf("r1 with its own inputs again = %d %s, want 202 or 200", code, body)
	}
}
