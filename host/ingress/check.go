package ingress

import (
	"net/http"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"
)

// refusal is why checkRequest refused a request: the answer's status,
// error code and message.
type refusal struct {
	status  int
	code    string
	message string
}

// checkRequest refuses a request whose path, query or headers a plugin
// should never see: text that is not UTF-8 or holds control characters
// (the data plane carries them as protobuf strings, and every plugin
// would have to guard against them), and a path with an encoded slash.
// The query is checked as sent and as a plugin decodes it (r.URL.Query):
// %FF or %00 in a value is as much the client's fault as the raw byte,
// and a malformed escape (%G0, a lone %) would make the plugin drop the
// parameter without a word. It returns nil for a request the ingress may
// route.
//
// The host matches and forwards the decoded path, so /a%2Fb would reach
// the route /a/b, while a front proxy's ACL that compares the raw path
// sees another path; refusing it with 404 keeps both views the same.
func checkRequest(r *http.Request) *refusal {
	if hasEncodedSlash(r.URL.EscapedPath()) {
		return &refusal{http.StatusNotFound, "not_found", "the path holds an encoded slash (%2F), which no route matches"}
	}
	if !validText(r.URL.Path, false) {
		return &refusal{http.StatusBadRequest, "bad_request", "the path is not UTF-8 text or holds control characters"}
	}
	if !validText(r.URL.RawQuery, false) {
		return &refusal{http.StatusBadRequest, "bad_request", "the query is not UTF-8 text or holds control characters"}
	}
	if bad := checkQuery(r.URL.RawQuery); bad != "" {
		return &refusal{http.StatusBadRequest, "bad_request", bad}
	}
	if !validText(r.Host, false) {
		return &refusal{http.StatusBadRequest, "bad_request", "the Host header is not UTF-8 text or holds control characters"}
	}
	for k, vs := range r.Header {
		// net/http has checked that names are tokens.
		for _, v := range vs {
			if !validText(v, true) {
				return &refusal{http.StatusBadRequest, "bad_request", "header " + k + " is not UTF-8 text or holds control characters"}
			}
		}
	}
	return nil
}

// checkQuery checks the names and values of a raw query once decoded, as
// url.ParseQuery decodes them (split at '&', '+' for a space), and
// returns why it refuses them, or "". Only a percent-escape can decode to
// what the raw query's own check let through, so a query without one
// costs a scan. A ';' is left as a character, not taken as a separator
// (as Go's own parser does), so it is no reason to refuse.
func checkQuery(q string) string {
	if strings.IndexByte(q, '%') < 0 {
		return ""
	}
	for part := range strings.SplitSeq(q, "&") {
		if strings.IndexByte(part, '%') < 0 {
			continue
		}
		name, value, _ := strings.Cut(part, "=")
		for _, s := range [2]string{name, value} {
			d, err := url.QueryUnescape(s)
			if err != nil {
				return "the query holds a malformed percent-escape"
			}
			if !validText(d, false) {
				return "the query, decoded, is not UTF-8 text or holds control characters"
			}
		}
	}
	return ""
}

// hasEncodedSlash reports whether an escaped path holds %2F in any case.
func hasEncodedSlash(p string) bool {
	for {
		i := strings.IndexByte(p, '%')
		if i < 0 || i+2 >= len(p) {
			return false
		}
		if p[i+1] == '2' && (p[i+2] == 'F' || p[i+2] == 'f') {
			return true
		}
		p = p[i+1:]
	}
}

// validText reports whether s is UTF-8 without control characters (C0,
// DEL and C1), a tab allowed where tab says so.
func validText(s string, tab bool) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f {
			return validRunes(s[i:], tab)
		}
	}
	return true
}

func validRunes(s string, tab bool) bool {
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		if (r == utf8.RuneError && n == 1) || (unicode.IsControl(r) && !(tab && r == '\t')) {
			return false
		}
		s = s[n:]
	}
	return true
}
