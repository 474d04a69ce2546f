// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
)

// post sends body (msgpack) to route with headers and returns the answer.
func (f *fixture) post(t *testing.T, route string, body any, headers map[string]string) (*http.Response, wire.ErrorResponse) {
	t.Helper()
	b, err := msgpack.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://d"+route, bytes.NewReader(b))
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e wire.ErrorResponse
	if resp.StatusCode != http.StatusOK {
		if err := msgpack.NewDecoder(resp.Body).Decode(&e); err != nil {
			t.Fatalf("%s: %d: %v", route, resp.StatusCode, err)
		}
	}
	return resp, e
}

// Every answer names the daemon's protocol, release and features; a
// client of the release before versions (no header) is served; one older
// than the daemon serves is refused naming both sides and saying to
// upgrade the client; a newer client's key this daemon lacks is refused
// saying to upgrade loaderd.
func TestVersionsExchanged(t *testing.T) {
	f := startWith(t, Config{Release: "9.8.7"})
	open := map[string]any{"dataset": "ds", "batch_size": 4, "num_shards": 1}

	resp, e := f.post(t, "/v1/sessions", open, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("an unversioned client's open: %d %s", resp.StatusCode, e.Error)
	}
	if got := resp.Header.Get(wire.ProtocolHeader); got != strconv.Itoa(wire.Protocol) {
		t.Errorf("%s = %q, want %d", wire.ProtocolHeader, got, wire.Protocol)
	}
	if got := resp.Header.Get(wire.ReleaseHeader); got != "9.8.7" {
		t.Errorf("%s = %q, want 9.8.7", wire.ReleaseHeader, got)
	}
	if got := resp.Header.Get(wire.FeaturesHeader); got != strings.Join(wire.Features(), ",") || !strings.Contains(got, "webdataset") {
		t.Errorf("%s = %q", wire.FeaturesHeader, got)
	}

	// An error answer, and a route that does not exist, carry them too.
	resp, _ = f.post(t, "/v1/nowhere", open, nil)
	if resp.StatusCode != http.StatusNotFound || resp.Header.Get(wire.ProtocolHeader) != strconv.Itoa(wire.Protocol) {
		t.Errorf("no route: %d, %s %q", resp.StatusCode, wire.ProtocolHeader, resp.Header.Get(wire.ProtocolHeader))
	}

	resp, e = f.post(t, "/v1/sessions", open, map[string]string{wire.ProtocolHeader: "0", wire.ReleaseHeader: "0.0.1"})
	if resp.StatusCode != http.StatusBadRequest || e.Code != wire.CodeVersion ||
		!strings.Contains(e.Error, "nvfeed 0.0.1 (protocol 0)") || !strings.Contains(e.Error, fmt.Sprintf("loaderd 9.8.7 (protocol %d)", wire.Protocol)) ||
		!strings.Contains(e.Error, "upgrade the client") {
		t.Errorf("a client of protocol 0: %d %q %q", resp.StatusCode, e.Code, e.Error)
	}
	resp, e = f.post(t, "/v1/sessions", open, map[string]string{wire.ProtocolHeader: "two"})
	if resp.StatusCode != http.StatusBadRequest || e.Code != wire.CodeVersion {
		t.Errorf("a protocol that is no number: %d %q %q", resp.StatusCode, e.Code, e.Error)
	}

	newer := map[string]any{"dataset": "ds", "batch_size": 4, "num_shards": 1, "sharpen": true}
	next := strconv.Itoa(wire.Protocol + 1)
	resp, e = f.post(t, "/v1/sessions", newer, map[string]string{wire.ProtocolHeader: next, wire.ReleaseHeader: "0.4.0"})
	if resp.StatusCode != http.StatusBadRequest || e.Code != wire.CodeVersion ||
		!strings.Contains(e.Error, `"sharpen"`) || !strings.Contains(e.Error, "nvfeed 0.4.0 (protocol "+next+")") ||
		!strings.Contains(e.Error, "upgrade loaderd") {
		t.Errorf("a newer client's unknown key: %d %q %q", resp.StatusCode, e.Code, e.Error)
	}
	// The same key from a client of this protocol is a malformed request.
	resp, e = f.post(t, "/v1/sessions", newer, map[string]string{wire.ProtocolHeader: strconv.Itoa(wire.Protocol)})
	if resp.StatusCode != http.StatusBadRequest || e.Code != wire.CodeInvalid {
		t.Errorf("an unknown key: %d %q %q", resp.StatusCode, e.Code, e.Error)
	}
}
