// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
)

// RequestReload asks the daemon listening on the unix socket at path to
// read its datasets' maps again (POST /v1/reload; the daemon grants it to
// root only) and returns what became of each dataset.
func RequestReload(ctx context.Context, path string) (wire.ReloadResponse, error) {
	var r wire.ReloadResponse
	err := request(ctx, path, http.MethodPost, "/v1/reload", "reload", &r)
	return r, err
}

// RequestStatus asks the daemon listening on the unix socket at path what
// it serves and holds (GET /v1/status): its answer follows the caller's
// rights (the sessions are every one's only for root).
func RequestStatus(ctx context.Context, path string) (wire.StatusResponse, error) {
	var r wire.StatusResponse
	err := request(ctx, path, http.MethodGet, "/v1/status", "status", &r)
	return r, err
}

// maxAnswer bounds an answer read (a status of every session and
// dataset is a few hundred bytes each).
const maxAnswer = 16 << 20

// ErrNotLoaderd is wrapped by a request's error when what listens on the
// socket answered, but not as loaderd: another HTTP service, or a
// service that does not speak HTTP.
var ErrNotLoaderd = errors.New("answered, but not as loaderd")

// request makes one request without a body of the daemon on the unix
// socket at path and decodes its msgpack answer into out; its errors
// start with what, and name the daemon's refusal. An answer that is not
// loaderd's (notLoaderd) is an error wrapping ErrNotLoaderd.
func request(ctx context.Context, path, method, route, what string, out any) error {
	first := &firstBytes{}
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, "unix", path)
		if err != nil {
			return nil, err
		}
		return &recordingConn{Conn: conn, first: first}, nil
	}}}
	defer c.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, method, "http://loaderd"+route, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	req.Header.Set(wire.ProtocolHeader, fmt.Sprint(wire.Protocol))
	resp, err := c.Do(req)
	if err != nil {
		if b := first.bytes(); len(b) > 0 && !bytes.HasPrefix(b, []byte("HTTP/")) {
			line, _, _ := bytes.Cut(b, []byte("\n"))
			return fmt.Errorf("%s: the socket at %s %w: it does not speak HTTP; it wrote %q", what, path, ErrNotLoaderd, clip(string(bytes.TrimSpace(line))))
		}
		return fmt.Errorf("%s: is loaderd listening on %s? %w", what, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return fmt.Errorf("%s: reading the answer: %w", what, err)
	}
	if why := notLoaderd(resp, body); why != "" {
		return fmt.Errorf("%s: the socket at %s %w: %s", what, path, ErrNotLoaderd, why)
	}
	if resp.StatusCode != http.StatusOK {
		var e wire.ErrorResponse
		if msgpack.Unmarshal(body, &e) != nil || e.Error == "" {
			e.Error = string(bytes.TrimSpace(body))
		}
		return fmt.Errorf("%s: the daemon answered %s: %s", what, resp.Status, e.Error)
	}
	if err := msgpack.Unmarshal(body, out); err != nil {
		return fmt.Errorf("%s: malformed answer: %w", what, err)
	}
	return nil
}

// notLoaderd describes an answer that is not loaderd's, "" for one that
// is: loaderd names its protocol (wire.ProtocolHeader) in every answer,
// and the release before it answered msgpack (application/msgpack) to
// every request this package makes.
func notLoaderd(resp *http.Response, body []byte) string {
	if resp.Header.Get(wire.ProtocolHeader) != "" {
		return ""
	}
	ct := resp.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err == nil && mt == "application/msgpack" {
		var m map[string]any
		if msgpack.Unmarshal(body, &m) == nil {
			return ""
		}
	}
	why := "an HTTP service answered " + resp.Status
	if ct != "" {
		why += ", " + ct
	}
	if srv := resp.Header.Get("Server"); srv != "" {
		why += " (Server: " + srv + ")"
	}
	if len(body) > 0 {
		why += fmt.Sprintf(": %q", clip(strings.Join(strings.Fields(string(body)), " ")))
	}
	return why
}

// clip shortens s to 80 bytes for an error.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// firstBytes keeps the first bytes read from a connection: what a
// service that is not HTTP wrote, for the error that says so.
type firstBytes struct {
	mu  sync.Mutex
	buf []byte
}

func (f *firstBytes) add(b []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := 256 - len(f.buf); n > 0 {
		f.buf = append(f.buf, b[:min(n, len(b))]...)
	}
}

func (f *firstBytes) bytes() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return bytes.Clone(f.buf)
}

// recordingConn is a connection whose first bytes read are kept.
type recordingConn struct {
	net.Conn
	first *firstBytes
}

func (c *recordingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.first.add(b[:n])
	return n, err
}
