// Command httpconsumer is the application side of `dlxbridge run`: a plain
// HTTP server, in any language, that the sidecar POSTs each validated
// message to. This one is Go with the standard library only; the contract
// is in docs/sidecar.md.
//
//	go run ./examples/httpconsumer -listen 127.0.0.1:8080
//
// It answers 204 to every message, except: a body containing "retry-me"
// gets 500 with Retry-After: 2 on its first attempt (this message failed,
// try it again later), and one containing "reject-me" gets 422 (a business
// rule: the sidecar quarantines it). 503 and 429 are for "my dependency is
// down": they pause the whole queue (docs/sidecar.md).
package main

import (
	"flag"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address to listen on")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	handle := func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
			return
		}
		attempt := r.Header.Get("Dlxbridge-Attempt")
		log.Info("message", "path", r.URL.Path,
			"type", r.Header.Get("Dlxbridge-Message-Type"), "version", r.Header.Get("Dlxbridge-Schema-Version"),
			"id", r.Header.Get("Dlxbridge-Message-Id"), "idempotency_key", r.Header.Get("Idempotency-Key"),
			"attempt", attempt, "traceparent", r.Header.Get("traceparent"))
		switch {
		case strings.Contains(string(body), "reject-me"):
			http.Error(w, "order rejected by business rule", http.StatusUnprocessableEntity)
		case strings.Contains(string(body), "retry-me") && attempt == "1":
			w.Header().Set("Retry-After", "2")
			http.Error(w, "inventory lookup failed", http.StatusInternalServerError)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", handle)
	mux.HandleFunc("POST /notifications", handle)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	log.Info("listening", "addr", *listen)
	if err := http.ListenAndServe(*listen, mux); err != nil {
		log.Error("serve", "error", err)
		os.Exit(1)
	}
}
