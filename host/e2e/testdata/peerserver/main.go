// Command peerserver is the backend of make bench-peers: a standalone Go
// net/http server answering GET / as plugins/hello's greet does, with the
// host's default ingress timeouts. nginx and HAProxy proxy to it, and it
// is loaded directly, beside the host and its hello plugin.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "peerserver:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("listen", "127.0.0.1:0", "address to listen on")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	// The address it listens on, for the script that started it.
	fmt.Println(ln.Addr())
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", greet)
	srv := &http.Server{Handler: mux, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, IdleTimeout: 60 * time.Second}
	return srv.Serve(ln)
}

// greet is plugins/hello's greet handler with its default greeting.
func greet(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"greeting": "hello"})
}
