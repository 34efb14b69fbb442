package h1

import (
	"bufio"
	"net/http"
	"slices"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// defaultUserAgent is what Request.Write sends when the request has no
// User-Agent header.
const defaultUserAgent = "Go-http-client/1.1"

// writeRequest writes req to bw as Request.Write does. A request without
// a body, no Connection: close, no Transfer-Encoding or trailers and a
// plain ASCII host (every request the gateway sends but those with a
// body) is written here, into the connection's buffer, with the same
// bytes but no httptrace hooks called (the gateway sets none); the rest
// goes through Request.Write. keys is the connection's scratch slice for
// the sorted header names; writeRequest returns it for the next request.
func writeRequest(bw *bufio.Writer, req *http.Request, keys []string) ([]string, error) {
	host, ruri, ok := plainHead(req)
	if !ok {
		return keys, req.Write(bw)
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	bw.WriteString(method)
	bw.WriteByte(' ')
	bw.WriteString(ruri)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\n")
	ua := defaultUserAgent
	if vs, ok := req.Header["User-Agent"]; ok {
		ua = ""
		if len(vs) > 0 {
			ua = vs[0]
		}
	}
	if ua != "" {
		// Cleaned after the test: a value of white space is sent empty.
		writeField(bw, "User-Agent", cleanValue(ua))
	}
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		// Many servers expect a length for these methods, even 0.
		bw.WriteString("Content-Length: 0\r\n")
	}
	keys = keys[:0]
	for k := range req.Header {
		switch k {
		case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !httpguts.ValidHeaderFieldName(k) {
			continue // Request.Write drops it too
		}
		for _, v := range req.Header[k] {
			writeField(bw, k, cleanValue(v))
		}
	}
	_, err := bw.WriteString("\r\n")
	clear(keys)
	if req.Body != nil {
		// Request.Write closes the body it wrote; this one is empty.
		if cerr := req.Body.Close(); err == nil {
			err = cerr
		}
	}
	return keys, err
}

// plainHead returns the Host field and the request target of a request
// that writeRequest writes itself, and false for any other.
func plainHead(req *http.Request) (host, ruri string, ok bool) {
	if req.URL == nil || req.Close || len(req.TransferEncoding) > 0 || req.Trailer != nil ||
		req.ContentLength != 0 || (req.Body != nil && req.Body != http.NoBody) || req.Method == http.MethodConnect {
		return "", "", false
	}
	host = req.Host
	if host == "" {
		host = req.URL.Host
	}
	for i := 0; i < len(host); i++ {
		// ASCII letters, digits and the punctuation of a name, an IPv4
		// or a bracketed IPv6 address and a port: nothing that
		// Request.Write would encode, strip or refuse.
		if c := host[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte(".-_:[]", c) >= 0) {
			return "", "", false
		}
	}
	ruri = req.URL.RequestURI()
	for i := 0; i < len(ruri); i++ {
		if c := ruri[i]; c < ' ' || c == 0x7f {
			return "", "", false // Request.Write refuses it: let it say so
		}
	}
	return host, ruri, true
}

// lineBreaks turns a value's line breaks to spaces.
var lineBreaks = strings.NewReplacer("\n", " ", "\r", " ")

// cleanValue is a header value as Request.Write sends it: line breaks
// turned to spaces, surrounding white space trimmed.
func cleanValue(v string) string {
	if strings.ContainsAny(v, "\r\n") {
		v = lineBreaks.Replace(v)
	}
	return strings.Trim(v, " \t\n\r")
}

func writeField(bw *bufio.Writer, k, v string) {
	bw.WriteString(k)
	bw.WriteString(": ")
	bw.WriteString(v)
	bw.WriteString("\r\n")
}
