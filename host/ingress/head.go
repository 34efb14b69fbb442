package ingress

import (
	"bytes"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// maxDirectHeaders bounds the header lines of a request the front serves
// itself; a request with more goes to net/http, which has its own bound.
const maxDirectHeaders = 64

// crlf2 ends a request head.
var crlf2 = []byte("\r\n\r\n")

// directRequest is a request head the front serves itself: the plain
// kind most requests are, which parseHead accepts only when net/http
// would read it the same way.
type directRequest struct {
	method string
	target string
	url    *url.URL
	header http.Header
	host   string
	close  bool // Connection: close
}

// headSpace is memory a connection lends parseHead for each request,
// reused once the request has been served: the header map, cleared, and
// the URL.
type headSpace struct {
	header http.Header
	url    url.URL
}

// reset clears sp for the next request.
func (sp *headSpace) reset() {
	sp.header = keepHeader(sp.header)
	sp.url = url.URL{}
}

// keepHeader returns h cleared to be used again, or nil if it grew past
// frontKeepHeaders names.
func keepHeader(h http.Header) http.Header {
	if len(h) > frontKeepHeaders {
		return nil
	}
	clear(h)
	return h
}

// parseHead parses the request head that b begins with, ending at its
// first CRLF CRLF, if it is one the front serves itself: GET or HEAD of an
// origin-form target over HTTP/1.1, with one valid Host and no body, no
// Expect, no Upgrade, no obsolete line folding and no bare CR or LF. For
// any other head (including one net/http would refuse) ok is false, and
// the connection goes to net/http, which answers it as it always has.
// n is the length of the head. The header map and the URL are sp's, if sp
// is not nil.
func parseHead(b []byte, sp *headSpace) (r directRequest, n int, ok bool) {
	end := bytes.Index(b, crlf2)
	if end < 0 {
		return r, 0, false
	}
	n = end + len(crlf2)
	head := b[:end+2] // each line with its CRLF
	for i, c := range head {
		switch c {
		case '\r':
			if i+1 >= len(head) || head[i+1] != '\n' {
				return r, 0, false
			}
		case '\n':
			if i == 0 || head[i-1] != '\r' {
				return r, 0, false
			}
		}
	}
	// One string holds the head; the target, names and values are parts
	// of it, and one slice holds every header's values, as net/http's
	// reader does.
	hs := string(head)
	line, rest, _ := strings.Cut(hs, "\r\n")
	method, line, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(line, " ")
	if !ok1 || !ok2 || proto != "HTTP/1.1" || len(target) == 0 || target[0] != '/' {
		return r, 0, false
	}
	switch method {
	case http.MethodGet:
		r.method = http.MethodGet
	case http.MethodHead:
		r.method = http.MethodHead
	default:
		return r, 0, false
	}
	for i := range len(target) {
		if c := target[i]; c <= ' ' || c >= 0x7f {
			return r, 0, false
		}
	}
	r.target = target
	if sp != nil && plainTarget(&sp.url, target) {
		r.url = &sp.url
	} else {
		u, err := url.ParseRequestURI(r.target)
		if err != nil {
			return r, 0, false
		}
		r.url = u
	}
	lines := strings.Count(rest, "\r\n")
	if lines > maxDirectHeaders {
		return r, 0, false
	}
	if sp != nil && sp.header != nil {
		r.header = sp.header // cleared by the connection
	} else {
		r.header = make(http.Header, min(lines, frontKeepHeaders))
		if sp != nil {
			sp.header = r.header
		}
	}
	values := make([]string, lines)
	hosts := 0
	for len(rest) > 0 {
		line, rest, _ = strings.Cut(rest, "\r\n")
		name, value, found := strings.Cut(line, ":")
		if !found || !httpguts.ValidHeaderFieldName(name) {
			return r, 0, false
		}
		v := textproto.TrimString(value)
		if !httpguts.ValidHeaderFieldValue(v) {
			return r, 0, false
		}
		key := textproto.CanonicalMIMEHeaderKey(name)
		switch key {
		case "Host":
			if hosts++; hosts > 1 || !httpguts.ValidHostHeader(v) {
				return r, 0, false
			}
			r.host = v
			continue
		case "Content-Length", "Transfer-Encoding", "Expect", "Upgrade", "Trailer", "Http2-Settings":
			return r, 0, false
		case "Connection":
			for opt := range strings.SplitSeq(v, ",") {
				switch strings.ToLower(textproto.TrimString(opt)) {
				case "keep-alive", "":
				case "close":
					r.close = true
				default:
					return r, 0, false
				}
			}
		}
		if vv := r.header[key]; vv == nil && len(values) > 0 {
			values[0] = v
			r.header[key] = values[:1:1]
			values = values[1:]
		} else {
			r.header[key] = append(vv, v)
		}
	}
	if hosts == 0 {
		return r, 0, false
	}
	// As net/http does (RFC 7234 section 5.4).
	if pragma, ok := r.header["Pragma"]; ok && len(pragma) > 0 && pragma[0] == "no-cache" {
		if _, ok := r.header["Cache-Control"]; !ok {
			r.header["Cache-Control"] = []string{"no-cache"}
		}
	}
	return r, n, true
}

// plainTarget sets u to what url.ParseRequestURI makes of target, and
// reports true, if its path has only characters a URL's path never
// escapes, so that its URL is the path and the query as they are.
func plainTarget(u *url.URL, target string) bool {
	path, query, hasQuery := strings.Cut(target, "?")
	for i := range len(path) {
		switch c := path[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '/', c == '-', c == '.', c == '_', c == '~':
		default:
			return false
		}
	}
	*u = url.URL{Path: path, RawQuery: query}
	// As net/url: a lone '?' at the end is kept as ForceQuery.
	if hasQuery && query == "" {
		u.ForceQuery = true
	}
	return true
}
