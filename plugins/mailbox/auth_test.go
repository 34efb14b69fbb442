package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
)

func rootKeyFile(t *testing.T) (string, []byte) {
	t.Helper()
	key := []byte(strings.Repeat("k", minRootKey))
	path := filepath.Join(t.TempDir(), "root.key")
	if err := os.WriteFile(path, key, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, key
}

func TestCapabilities(t *testing.T) {
	path, key := rootKeyFile(t)
	clock := newFakeClock()
	h := serve(t, newDefinition(&mailbox{clock: clock}), plugintest.Options{Config: `
auth {
  enabled = true
  root_key_file = "` + path + `"
}`})
	tok := func(topic string, ops []string, ttl time.Duration) string {
		s, err := mint(key, topic, ops, clock.Now().Add(ttl))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	other, _ := mint(bytes.Repeat([]byte("x"), minRootKey), "t", []string{"send"}, time.Time{})
	send := `{"topic":"t","payload":"YQ=="}`
	tests := []struct {
		name, path, body, token string
		code                    int
		want                    string
	}{
		{"allowed send", "/v1/send", send, tok("t", []string{"send"}, time.Hour), 200, ""},
		{"any topic", "/v1/send", send, tok("", []string{"send"}, time.Hour), 200, ""},
		{"no token", "/v1/send", send, "", 401, "unauthenticated"},
		{"garbage token", "/v1/send", send, "!!", 401, "unauthenticated"},
		{"another root key", "/v1/send", send, other, 401, "unauthenticated"},
		{"wrong topic", "/v1/send", send, tok("u", []string{"send"}, time.Hour), 403, "forbidden"},
		{"wrong op", "/v1/send", send, tok("t", []string{"recv"}, time.Hour), 403, "forbidden"},
		{"expired", "/v1/send", send, tok("t", []string{"send"}, -time.Second), 403, "forbidden"},
		{"recv of the DLQ", "/v1/recv", `{"topic":"t.dlq"}`, tok("t", []string{"recv"}, time.Hour), 200, ""},
		{"recv, send only", "/v1/recv", `{"topic":"t"}`, tok("t", []string{"send"}, time.Hour), 403, "forbidden"},
		{"topic counts", "/v1/topics/t", "", tok("t", []string{"recv"}, time.Hour), 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			method := "POST"
			if tt.body == "" {
				method = "GET"
			}
			var hdr []string
			if tt.token != "" {
				hdr = []string{"Authorization", "Bearer " + tt.token}
			}
			code, body := call(t, h, method, tt.path, tt.body, hdr...)
			if code != tt.code || (tt.want != "" && errorCode(body) != tt.want) {
				t.Errorf("%s %s = %d %s, want %d %s", method, tt.path, code, body, tt.code, tt.want)
			}
		})
	}
	// An ack is checked against the message's topic.
	code, body := call(t, h, "POST", "/v1/recv", `{"topic":"t"}`, "Authorization", "Bearer "+tok("t", []string{"recv"}, time.Hour))
	var got recvAnswer
	if code != 200 || json.Unmarshal([]byte(body), &got) != nil || len(got.Messages) == 0 {
		t.Fatalf("recv = %d %s", code, body)
	}
	settle := `{"msg_id":"` + got.Messages[0].MsgID + `","receipt":"` + got.Messages[0].Receipt + `"}`
	if code, body := call(t, h, "POST", "/v1/ack", settle, "Authorization", "Bearer "+tok("u", []string{"ack"}, time.Hour)); code != 403 {
		t.Errorf("ack with a token for another topic = %d %s, want 403", code, body)
	}
	if code, body := call(t, h, "POST", "/v1/ack", settle, "Authorization", "Bearer "+tok("t", []string{"ack"}, time.Hour)); code != 200 {
		t.Errorf("ack with the topic's ack token = %d %s, want 200", code, body)
	}
	// A cached verification still checks expiry.
	short := tok("t", []string{"send"}, time.Minute)
	if code, _ := call(t, h, "POST", "/v1/send", send, "Authorization", "Bearer "+short); code != 200 {
		t.Fatalf("send with a fresh token = %d", code)
	}
	clock.add(time.Minute)
	if code, _ := call(t, h, "POST", "/v1/send", send, "Authorization", "Bearer "+short); code != 403 {
		t.Errorf("send with the token, now expired and cached = %d, want 403", code)
	}
}

func TestCapabilityCaveats(t *testing.T) {
	_, key := rootKeyFile(t)
	tok, err := mint(key, "t", []string{"send", "recv"}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := parseCapability(tok, key)
	if err != nil || c.topic != "t" || strings.Join(c.ops, ",") != "send,recv" || !c.expires.IsZero() {
		t.Errorf("parseCapability(mint(t, send,recv)) = %+v, %v", c, err)
	}
	if _, err := parseCapability(tok, bytes.Repeat([]byte("y"), minRootKey)); !errors.Is(err, errUnauthenticated) {
		t.Errorf("parseCapability with another key = %v, want errUnauthenticated", err)
	}
}

func TestMint(t *testing.T) {
	path, key := rootKeyFile(t)
	var out, errb bytes.Buffer
	if code := run([]string{"mint", "-root-key-file", path, "-topic", "t", "-ops", "send,ack", "-ttl", "1h"}, &out, &errb); code != 0 {
		t.Fatalf("mailbox mint = %d: %s", code, errb.String())
	}
	c, err := parseCapability(strings.TrimSpace(out.String()), key)
	if err != nil || c.topic != "t" || strings.Join(c.ops, ",") != "send,ack" || time.Until(c.expires) > time.Hour || time.Until(c.expires) < 59*time.Minute {
		t.Errorf("minted token = %+v, %v; want topic t, send,ack, an hour", c, err)
	}
	if code := run([]string{"mint", "-root-key-file", path, "-ops", "delete"}, &out, &errb); code != 2 {
		t.Errorf("mailbox mint -ops delete = %d, want 2", code)
	}
	out.Reset()
	past := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	if code := run([]string{"mint", "-root-key-file", path, "-ops", "send", "-expires", past.Format(time.RFC3339)}, &out, &errb); code != 0 {
		t.Fatalf("mailbox mint -expires = %d: %s", code, errb.String())
	}
	if c, err := parseCapability(strings.TrimSpace(out.String()), key); err != nil || !c.expires.Equal(past) {
		t.Errorf("token minted with -expires %s = %+v, %v; want it to expire then", past.Format(time.RFC3339), c, err)
	}
	if code := run([]string{"mint", "-root-key-file", path, "-ops", "send", "-expires", "tomorrow"}, &out, &errb); code != 2 {
		t.Errorf("mailbox mint -expires tomorrow = %d, want 2", code)
	}
}

// TestRootKeyRefused: a root key file that cannot serve is refused at
// auth.root_key_file, where the host shows its file and line.
func TestRootKeyRefused(t *testing.T) {
	short := filepath.Join(t.TempDir(), "short.key")
	if err := os.WriteFile(short, make([]byte, 10), 0o600); err != nil {
		t.Fatal(err)
	}
	plugintest.Refused(t, definition(), plugintest.Options{DataDir: t.TempDir(), Config: `
auth {
  enabled = true
  root_key_file = "` + short + `"
}`}, "auth.root_key_file")
}
