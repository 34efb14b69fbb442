package e2e

import (
	"net/http"
	"strings"
	"testing"
)

func TestHelloThroughHost(t *testing.T) {
	h := startHost(t, baseConfig("2s")+pluginBlock("hello", "hello", `  config {
    greeting = "bonjour"
  }`))
	code, body := h.get(h.ingress + "/hello/")
	if code != http.StatusOK || !strings.Contains(body, `"greeting":"bonjour"`) {
		t.Fatalf("GET /hello/ = %d %s, want 200 with the configured greeting", code, body)
	}
	code, body = h.get(h.ingress + "/readyz")
	if code != http.StatusOK || !strings.Contains(body, `"state":"ready"`) {
		t.Fatalf("GET /readyz = %d %s, want 200 with hello ready", code, body)
	}
}
