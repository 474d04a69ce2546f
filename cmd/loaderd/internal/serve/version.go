// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
)

// Versions (docs/protocol.md, Versions): every answer says the daemon's
// protocol, release and features; every request's client is known by
// its protocol (none: the release before versions were exchanged, served
// with that release's meanings and defaults). A client older than the
// daemon serves is refused naming both versions; a newer client's key
// this daemon does not know is refused saying to upgrade loaderd.

// versionsKey is the context key of a request's versions.
type versionsKey struct{}

// versions are the two sides of a request.
type versions struct {
	daemon, client wire.Side
}

// daemonSide is the daemon's side for release ("" reads "dev").
func daemonSide(release string) wire.Side {
	if release == "" {
		release = "dev"
	}
	return wire.Side{Name: "loaderd", Protocol: wire.Protocol, Release: release}
}

// versioned answers every request with the daemon's version headers, and
// refuses one whose client it cannot serve; the request's context carries
// both sides for decode's errors.
func (s *Server) versioned(next http.Handler) http.Handler {
	features := strings.Join(wire.Features(), ",")
	protocol := strconv.Itoa(wire.Protocol)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set(wire.ProtocolHeader, protocol)
		h.Set(wire.ReleaseHeader, s.daemon.Release)
		h.Set(wire.FeaturesHeader, features)
		p, err := wire.ParseProtocol(r.Header.Get(wire.ProtocolHeader))
		if err != nil {
			fail(w, err)
			return
		}
		client := wire.Side{Name: "nvfeed", Protocol: p, Release: r.Header.Get(wire.ReleaseHeader)}
		if len(client.Release) > 64 {
			client.Release = client.Release[:64]
		}
		if err := wire.CheckClient(s.daemon, client, nil); err != nil {
			fail(w, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), versionsKey{}, versions{daemon: s.daemon, client: client})))
	})
}

// versionError is decode's error for a key a newer client sent that this
// daemon does not know (wrapping wire.ErrVersion), else err.
func versionError(r *http.Request, err error) error {
	v, ok := r.Context().Value(versionsKey{}).(versions)
	if !ok || !errors.Is(err, wire.ErrMalformed) {
		return err
	}
	if verr := wire.CheckClient(v.daemon, v.client, err); verr != nil {
		return fmt.Errorf("%w (%w)", verr, err)
	}
	return err
}

// writeVersionHeaders writes the version headers set on w's header (by
// versioned) into a hijacked connection's answer.
func writeVersionHeaders(w http.ResponseWriter, line func(string, string)) {
	for _, k := range []string{wire.ProtocolHeader, wire.ReleaseHeader, wire.FeaturesHeader} {
		if v := w.Header().Get(k); v != "" {
			line(k, v)
		}
	}
}
