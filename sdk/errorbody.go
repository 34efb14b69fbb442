package sdk

import (
	"bytes"
	"encoding/json"
	"net/http"
)

// WriteError answers with the platform's JSON error body, the one the host
// and every plugin send:
//
//	{"error":{"code":"not_found","message":"no greeting for ada"}}
//
// code is a stable snake_case word clients branch on; message is for
// people. It sets Content-Type, and on 429 and 503 Retry-After: 1 unless
// the handler has set Retry-After already.
func WriteError(w http.ResponseWriter, status int, code, message string) {
	WriteErrorBody(w, status, ErrorBody(code, message, nil))
}

// WriteErrorBody answers with body, an ErrorBody, as WriteError does. It is
// for errors whose object has members of the plugin's own, and for bodies
// prepared ahead, such as a recorded answer replayed.
func WriteErrorBody(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if (status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests) && h.Get("Retry-After") == "" {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// ErrorBody returns the platform's JSON error body for code and message,
// with a trailing newline. extra, unless nil, adds members to the error
// object after code and message: it must encode as a JSON object, such as
// a struct of the plugin's own fields, and members it leaves out with
// omitempty add nothing. An extra that does not encode as an object is
// left out.
func ErrorBody(code, message string, extra any) []byte {
	b := make([]byte, 0, 48+len(code)+len(message))
	b = append(b, `{"error":{"code":`...)
	b = appendString(b, code)
	b = append(b, `,"message":`...)
	b = appendString(b, message)
	if extra != nil {
		if m, err := json.Marshal(extra); err == nil && len(m) > 2 && m[0] == '{' && m[len(m)-1] == '}' {
			b = append(b, ',')
			b = append(b, bytes.TrimSpace(m[1:len(m)-1])...)
		}
	}
	return append(b, "}}\n"...)
}

// appendString appends s as a JSON string, escaped as encoding/json does.
func appendString(b []byte, s string) []byte {
	q, err := json.Marshal(s)
	if err != nil {
		// A string always encodes; invalid UTF-8 becomes U+FFFD.
		return append(b, `""`...)
	}
	return append(b, q...)
}
