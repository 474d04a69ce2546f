// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"fmt"
	"mime"
	"net/http"
	"strings"
)

// Read-only endpoints answer JSON to a request that asks for it
// (Accept: application/json), so that curl and an operator's scripts read
// them without a msgpack decoder; msgpack stays the default. The JSON is
// the msgpack answer in another encoding: the same keys, the same fields
// left out, the same per-caller visibility (the handler decides what the
// caller sees; only the encoding differs).

// jsonReply marks a response whose request asked for JSON: writeMsg
// encodes its messages as JSON.
type jsonReply struct{ http.ResponseWriter }

// Unwrap gives http.ResponseController the connection's writer.
func (j jsonReply) Unwrap() http.ResponseWriter { return j.ResponseWriter }

// negotiate makes the GET and HEAD requests that accept JSON and not
// msgpack answer JSON (their errors too); every other request is left as
// it is.
func negotiate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Vary", "Accept")
		if (r.Method == http.MethodGet || r.Method == http.MethodHead) && wantsJSON(r.Header.Values("Accept")) {
			w = jsonReply{w}
		}
		next.ServeHTTP(w, r)
	})
}

// wantsJSON reports whether Accept headers name application/json and
// not application/msgpack (which, named too, keeps the default).
func wantsJSON(accept []string) bool {
	var json bool
	for _, h := range accept {
		for _, part := range strings.Split(h, ",") {
			mt, _, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err != nil {
				continue
			}
			switch mt {
			case "application/msgpack", "application/x-msgpack":
				return false
			case "application/json":
				json = true
			}
		}
	}
	return json
}

// healthz answers "ok": a line of text, or {"status": "ok"} in JSON.
func healthz(w http.ResponseWriter, _ *http.Request) {
	if _, ok := w.(jsonReply); ok {
		writeMsg(w, http.StatusOK, map[string]string{"status": "ok"})
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprint(w, "ok\n")
}
