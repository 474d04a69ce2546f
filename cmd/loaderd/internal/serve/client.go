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
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}}
	defer c.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://loaderd/v1/reload", nil)
	if err != nil {
		return wire.ReloadResponse{}, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return wire.ReloadResponse{}, fmt.Errorf("reload: is loaderd listening on %s? %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, wire.MaxBody))
	if err != nil {
		return wire.ReloadResponse{}, fmt.Errorf("reload: reading the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e wire.ErrorResponse
		if msgpack.Unmarshal(body, &e) != nil || e.Error == "" {
			e.Error = string(bytes.TrimSpace(body))
		}
		return wire.ReloadResponse{}, fmt.Errorf("reload: the daemon answered %s: %s", resp.Status, e.Error)
	}
	var r wire.ReloadResponse
	if err := msgpack.Unmarshal(body, &r); err != nil {
		return wire.ReloadResponse{}, fmt.Errorf("reload: malformed answer: %w", err)
	}
	return r, nil
}
