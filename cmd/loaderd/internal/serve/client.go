// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"

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

// request makes one request without a body of the daemon on the unix
// socket at path and decodes its msgpack answer into out; its errors
// start with what, and name the daemon's refusal.
func request(ctx context.Context, path, method, route, what string, out any) error {
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}}
	defer c.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, method, "http://loaderd"+route, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("%s: is loaderd listening on %s? %w", what, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return fmt.Errorf("%s: reading the answer: %w", what, err)
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
