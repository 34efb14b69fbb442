package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"gopkg.in/macaroon.v2"

	"github.com/plughost/plughost/sdk/store"
)

// Capability tokens are macaroons (gopkg.in/macaroon.v2) minted with the
// root key in auth.root_key_file, sent as "Authorization: Bearer
// BASE64URL". Their first-party caveats bind them:
//
//	topic = NAME              the topic, and its NAME.dlq
//	ops = send,recv,ack       the operations allowed
//	expires = RFC3339 time    when the token stops working
//
// recv covers receive, stream and topic counts; ack covers ack, nack,
// extend and terminate; redrive is an op of its own. A token without a
// topic caveat covers every topic; one without ops, none.

// Errors of authorization: 401 without a valid token, 403 with the reason
// when the token does not allow the request.
var (
	errUnauthenticated = errors.New("a valid bearer capability token is required")
	errForbidden       = errors.New("the capability token does not allow this")
)

// minRootKey is the shortest root key accepted.
const minRootKey = 32

// failureBurst failures within failureWindow empty the verification cache.
const (
	failureBurst  = 32
	failureWindow = time.Second
)

// capability is what a verified token allows.
type capability struct {
	topic   string // "" for any
	ops     []string
	expires time.Time // zero for never
	cached  time.Time // when verified
}

// authority verifies tokens, caching what each allows for ttl. The mutex
// guards only the cache.
type authority struct {
	rootKey []byte
	ttl     time.Duration

	mu       sync.Mutex
	cache    map[string]capability
	failures []time.Time
}

func newAuthority(rootKeyFile string, ttl time.Duration) (*authority, error) {
	key, err := readRootKey(rootKeyFile)
	if err != nil {
		return nil, err
	}
	return &authority{rootKey: key, ttl: ttl, cache: map[string]capability{}}, nil
}

func readRootKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read root key: %w", err)
	}
	b = []byte(strings.TrimSpace(string(b)))
	if len(b) < minRootKey {
		return nil, fmt.Errorf("root key in %s: %d bytes, want at least %d", path, len(b), minRootKey)
	}
	return b, nil
}

// authorize checks that r's token allows op on topic at now.
func (a *authority) authorize(r *http.Request, topic, op string, now time.Time) error {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return errUnauthenticated
	}
	c, err := a.verify(tok, now)
	if err != nil {
		return err
	}
	switch {
	case !c.expires.IsZero() && !now.Before(c.expires):
		return fmt.Errorf("expired at %s: %w", c.expires.Format(time.RFC3339), errForbidden)
	case c.topic != "" && topic != c.topic && topic != c.topic+dlqSuffix:
		return fmt.Errorf("for topic %q, not %q: %w", c.topic, topic, errForbidden)
	case !slices.Contains(c.ops, op):
		return fmt.Errorf("allows %s, not %s: %w", strings.Join(c.ops, ","), op, errForbidden)
	}
	return nil
}

// verify returns what tok allows, from the cache or by checking its
// signature against the root key.
func (a *authority) verify(tok string, now time.Time) (capability, error) {
	a.mu.Lock()
	c, ok := a.cache[tok]
	a.mu.Unlock()
	if ok && now.Sub(c.cached) < a.ttl {
		return c, nil
	}
	c, err := parseCapability(tok, a.rootKey)
	if err != nil {
		a.failed(now)
		return c, err
	}
	c.cached = now
	a.mu.Lock()
	a.cache[tok] = c
	a.mu.Unlock()
	return c, nil
}

// failed counts a failed verification; a burst of them empties the
// cache, as the seed's cap cache refresher does on an error spike.
func (a *authority) failed(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.failures = append(a.failures, now)
	for len(a.failures) > 0 && now.Sub(a.failures[0]) > failureWindow {
		a.failures = a.failures[1:]
	}
	if len(a.failures) >= failureBurst {
		clear(a.cache)
		a.failures = a.failures[:0]
	}
}

// parseCapability decodes tok, checks its signature with rootKey and
// reads its caveats; a caveat it does not know refuses the token.
func parseCapability(tok string, rootKey []byte) (capability, error) {
	var c capability
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return c, fmt.Errorf("decode token: %w", errUnauthenticated)
	}
	var m macaroon.Macaroon
	if err := m.UnmarshalBinary(b); err != nil {
		return c, fmt.Errorf("decode token: %w", errUnauthenticated)
	}
	conds, err := m.VerifySignature(rootKey, nil)
	if err != nil {
		return c, fmt.Errorf("token signature: %w", errUnauthenticated)
	}
	topics := 0
	for _, cond := range conds {
		k, v, ok := strings.Cut(cond, " = ")
		switch {
		case !ok:
			return c, fmt.Errorf("caveat %q: %w", cond, errUnauthenticated)
		case k == "topic":
			// Two topic caveats would each narrow the other: allow neither.
			if topics++; topics > 1 {
				return c, fmt.Errorf("token names two topics: %w", errForbidden)
			}
			c.topic = v
		case k == "ops":
			ops := strings.Split(v, ",")
			if c.ops != nil { // a later caveat narrows the earlier ones
				ops = slices.DeleteFunc(ops, func(o string) bool { return !slices.Contains(c.ops, o) })
			}
			c.ops = ops
		case k == "expires":
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				return c, fmt.Errorf("caveat %q: %w", cond, errUnauthenticated)
			}
			if c.expires.IsZero() || t.Before(c.expires) {
				c.expires = t
			}
		default:
			return c, fmt.Errorf("unknown caveat %q: %w", cond, errUnauthenticated)
		}
	}
	if c.ops == nil {
		c.ops = []string{}
	}
	return c, nil
}

// mint makes a token for topic ("" for any) allowing ops until expires
// (zero for never).
func mint(rootKey []byte, topic string, ops []string, expires time.Time) (string, error) {
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return "", err
	}
	m, err := macaroon.New(rootKey, id, "mailbox", macaroon.V2)
	if err != nil {
		return "", err
	}
	conds := []string{"ops = " + strings.Join(ops, ",")}
	if topic != "" {
		conds = append(conds, "topic = "+topic)
	}
	if !expires.IsZero() {
		conds = append(conds, "expires = "+expires.UTC().Format(time.RFC3339))
	}
	for _, c := range conds {
		if err := m.AddFirstPartyCaveat([]byte(c)); err != nil {
			return "", err
		}
	}
	b, err := m.MarshalBinary()
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// knownOps are the operations a token may allow.
var knownOps = []string{"send", "recv", "ack", "redrive"}

// runMint is "mailbox mint -root-key-file F [-topic T] -ops send,recv
// [-ttl D | -expires RFC3339]": it prints a token. -expires is an
// absolute time, which may be past: such a token is refused at once, as
// an operator checking that expiry is enforced wants.
func runMint(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mailbox mint", flag.ContinueOnError)
	fs.SetOutput(stderr)
	keyFile := fs.String("root-key-file", "", "the file holding the root key, as auth.root_key_file")
	topic := fs.String("topic", "", "the topic the token is for (and its .dlq); empty for every topic")
	ops := fs.String("ops", "", "operations allowed, comma-separated: "+strings.Join(knownOps, ", "))
	ttl := fs.Duration("ttl", time.Hour, "how long the token works; 0 for ever")
	expires := fs.String("expires", "", "when the token stops working, an RFC3339 time (past ones allowed); instead of -ttl")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	list := strings.Split(*ops, ",")
	for _, o := range list {
		if !slices.Contains(knownOps, o) {
			fmt.Fprintf(stderr, "mailbox mint: op %q: want some of %s\n", o, strings.Join(knownOps, ","))
			return 2
		}
	}
	if *keyFile == "" || fs.NArg() != 0 || (*topic != "" && !validTopic(*topic)) || *ttl < 0 {
		fs.Usage()
		return 2
	}
	var exp time.Time
	switch {
	case *expires != "":
		var err error
		if exp, err = time.Parse(time.RFC3339, *expires); err != nil {
			fmt.Fprintf(stderr, "mailbox mint: -expires %q: want an RFC3339 time\n", *expires)
			return 2
		}
	case *ttl > 0:
		exp = time.Now().Add(*ttl)
	}
	key, err := readRootKey(*keyFile)
	if err != nil {
		fmt.Fprintln(stderr, "mailbox mint:", err)
		return 1
	}
	tok, err := mint(key, *topic, list, exp)
	if err != nil {
		fmt.Fprintln(stderr, "mailbox mint:", err)
		return 1
	}
	fmt.Fprintln(stdout, tok)
	return 0
}

// allow checks r's token for op on topic when auth is enabled.
func (run *running) allow(r *http.Request, topic, op string) error {
	if run.auth == nil {
		return nil
	}
	return run.auth.authorize(r, topic, op, run.clock.Now())
}

// allowMessage is allow for an operation on message id, whose topic is
// read from the store; a message not found has no topic, which only a
// token for every topic covers.
func (run *running) allowMessage(r *http.Request, id uint64, op string) error {
	if run.auth == nil {
		return nil
	}
	var topic string
	if err := run.db.View(func(s *store.Snapshot) error {
		if m, err := decodeMeta(s.Get(bucketMeta, idKey(id))); err == nil {
			topic = m.Topic
		}
		return nil
	}); err != nil {
		return err
	}
	return run.auth.authorize(r, topic, op, run.clock.Now())
}
