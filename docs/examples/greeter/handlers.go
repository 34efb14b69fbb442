package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/plughost/plughost/sdk"
)

// greeting is the answer of GET / and GET /greet/{name}.
type greeting struct {
	Greeting string `json:"greeting"`
}

// root answers GET / with the configured greeting.
func (g *greeter) root(w http.ResponseWriter, _ *http.Request) {
	g.greetings.WithLabelValues("plain").Inc()
	writeJSON(w, http.StatusOK, greeting{Greeting: g.cfg.Greeting})
}

// greet answers GET /greet/{name} with the name's custom greeting, or the
// configured one.
func (g *greeter) greet(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := checkName(name, g.cfg.MaxNameLen); err != nil {
		writeError(w, err)
		return
	}
	word, kind := g.cfg.Greeting, "named"
	if custom, ok := g.store.get(name); ok {
		word, kind = custom, "custom"
	}
	g.greetings.WithLabelValues(kind).Inc()
	writeJSON(w, http.StatusOK, greeting{Greeting: word + ", " + name})
}

// customGreeting is the body of POST /greetings, and its answer.
type customGreeting struct {
	Name     string `json:"name"`
	Greeting string `json:"greeting"`
}

// setGreeting answers POST /greetings: 201 for a new name, 200 for a
// changed one.
func (g *greeter) setGreeting(w http.ResponseWriter, r *http.Request) {
	cg, err := parseCustomGreeting(r.Header.Get("Content-Type"), r.Body, g.cfg.MaxNameLen)
	if err != nil {
		writeError(w, err)
		return
	}
	created, err := g.store.set(cg.Name, cg.Greeting, time.Now())
	if err != nil {
		writeError(w, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, cg)
}

// parseCustomGreeting decodes a POST /greetings body. It accepts exactly
// one JSON object of at most maxBodyBytes, with a valid name and greeting
// and no other fields.
func parseCustomGreeting(contentType string, body io.Reader, maxNameLen int) (customGreeting, error) {
	var cg customGreeting
	if mt, _, err := mime.ParseMediaType(contentType); err != nil || mt != "application/json" {
		return cg, errMediaType
	}
	b, err := io.ReadAll(io.LimitReader(body, maxBodyBytes+1))
	if err != nil {
		return cg, fmt.Errorf("read body: %w", err)
	}
	if len(b) > maxBodyBytes {
		return cg, errTooLarge
	}
	if !utf8.Valid(b) {
		// encoding/json would quietly turn bad bytes into U+FFFD.
		return cg, invalidf("body is not UTF-8")
	}
	if err := sdk.DecodeJSON(bytes.NewReader(b), &cg); err != nil {
		if errors.Is(err, sdk.ErrTrailingData) {
			return cg, invalidf("body must hold one JSON object and nothing after it")
		}
		return cg, invalidf(`body must be {"name": "...", "greeting": "..."}: %v`, err)
	}
	if err := checkName(cg.Name, maxNameLen); err != nil {
		return cg, err
	}
	if err := checkGreeting(cg.Greeting); err != nil {
		return cg, err
	}
	return cg, nil
}

// checkName accepts printable names of 1 to maxLen characters.
func checkName(name string, maxLen int) error {
	switch n := utf8.RuneCountInString(name); {
	case strings.TrimSpace(name) == "":
		return invalidf("name is empty")
	case n > maxLen:
		return invalidf("name is %d characters long; at most %d are allowed", n, maxLen)
	case !printable(name):
		return invalidf("name must be printable UTF-8 text")
	}
	return nil
}

// checkGreeting accepts printable greetings of 1 to maxGreetingLen
// characters.
func checkGreeting(s string) error {
	switch n := utf8.RuneCountInString(s); {
	case strings.TrimSpace(s) == "":
		return invalidf("greeting is empty")
	case n > maxGreetingLen:
		return invalidf("greeting is %d characters long; at most %d are allowed", n, maxGreetingLen)
	case !printable(s):
		return invalidf("greeting must be printable UTF-8 text")
	}
	return nil
}

// printable reports whether s is valid UTF-8 without control or other
// non-printing characters; a plain space is fine.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// slow answers GET /slow?ms=N after N milliseconds, or as soon as the
// request's context ends because the caller left or the deadline passed.
func slow(w http.ResponseWriter, r *http.Request) {
	ms, err := strconv.ParseInt(r.URL.Query().Get("ms"), 10, 64)
	if err != nil || ms < 0 || ms > maxSlow.Milliseconds() {
		writeError(w, invalidf("ms must be an integer from 0 to %d", maxSlow.Milliseconds()))
		return
	}
	t := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		writeJSON(w, http.StatusOK, map[string]int64{"slept_ms": ms})
	case <-r.Context().Done():
		writeError(w, r.Context().Err())
	}
}

// Errors a request can end in, besides *invalidError and *cooldownError.
var (
	errMediaType = errors.New("content type must be application/json")
	errTooLarge  = fmt.Errorf("body is larger than %d bytes", maxBodyBytes)
	errFull      = errors.New("no room for another name: max_greetings reached")
	errClosed    = errors.New("the plugin is draining")
)

// invalidError is input the caller must fix. Its message says how.
type invalidError struct{ msg string }

func (e *invalidError) Error() string { return e.msg }

func invalidf(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}

// writeError answers err in the platform's JSON error shape. It is the one
// place where the plugin's errors become HTTP statuses.
func writeError(w http.ResponseWriter, err error) {
	status, code := http.StatusInternalServerError, "internal"
	var invalid *invalidError
	var cooldown *cooldownError
	switch {
	case errors.As(err, &invalid):
		status, code = http.StatusBadRequest, "bad_request"
	case errors.Is(err, errMediaType):
		status, code = http.StatusUnsupportedMediaType, "unsupported_media_type"
	case errors.Is(err, errTooLarge):
		status, code = http.StatusRequestEntityTooLarge, "body_too_large"
	case errors.As(err, &cooldown):
		status, code = http.StatusTooManyRequests, "cooldown"
		w.Header().Set("Retry-After", strconv.Itoa(cooldown.seconds()))
	case errors.Is(err, errFull):
		status, code = http.StatusInsufficientStorage, "full"
	case errors.Is(err, errClosed):
		status, code = http.StatusServiceUnavailable, "draining"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// Nobody reads this: the caller left, or the host answered 504.
		status, code = http.StatusServiceUnavailable, "cancelled"
	}
	// WriteError adds Retry-After: 1 to a 429 or 503 without one.
	sdk.WriteError(w, status, code, err.Error())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
