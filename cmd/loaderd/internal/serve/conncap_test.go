// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
)

// TestConnectionCapKeepsRootsShare: under a low fd limit, nine throwaway
// uids each hold their whole cap of connections (9 × 64, more than the
// limit leaves); the connections past the daemon's total are answered 429
// naming it, and root's open and next are still answered at once. Before,
// accept failed for want of descriptors and root's requests hung.
func TestConnectionCapKeepsRootsShare(t *testing.T) {
	const uids, firstUID = 9, 43117
	m := start(t, time.Minute).m
	publicDataset(t, m)
	sock := filepath.Join(publicDir(t), "d.sock")
	victim, victimOut := asUser(t, 0, opener, nil, sock, "2")
	lowerFDLimit(t, 400)
	serveWith(t, m, Config{SessionTimeout: time.Minute, MaxSessions: 4}, Listen{Socket: sock, Mode: 0o666})
	var outs []interface {
		Scan() bool
		Text() string
	}
	for i := range uids {
		in, out := asUser(t, firstUID+i, flooder, nil, sock, fmt.Sprint(DefaultMaxConnsPerUID))
		defer in.Close()
		outs = append(outs, out)
	}
	refusedAll := 0
	for i, out := range outs {
		if !out.Scan() {
			t.Fatalf("uid %d's flooding client died", firstUID+i)
		}
		got := out.Text()
		t.Logf("uid %d: %.240s", firstUID+i, got)
		if strings.Contains(got, "429 Too Many Requests") && strings.Contains(got, "all users together") && strings.Contains(got, "kept for root") {
			refusedAll++
		}
	}
	if refusedAll == 0 {
		t.Errorf("no flooder's last connection was answered 429 naming the limit for all users")
	}
	io.WriteString(victim, "go\n")
	if !victimOut.Scan() {
		t.Fatal("root's opening client died")
	}
	if got := victimOut.Text(); !strings.HasPrefix(got, "HTTP/1.1 200 ") {
		t.Errorf("root's open while %d uids hold %d connections each: %q, want 200 at once", uids, DefaultMaxConnsPerUID, got)
	}
	c := unixClient(sock)
	c.http.Timeout = 2 * time.Second
	var o wire.OpenResponse
	began := time.Now()
	if code, raw := c.call(t, "POST", "/v1/sessions", map[string]any{"dataset": "ds", "batch_size": 4, "num_shards": 1}, &o); code != http.StatusOK {
		t.Fatalf("root's open: %d %q", code, raw)
	}
	if code, raw := c.call(t, "POST", "/v1/sessions/"+o.ID+"/next", nil, nil); code != http.StatusOK {
		t.Errorf("root's next: %d %q", code, raw)
	}
	t.Logf("root's open and next took %v", time.Since(began))
}

// TestMaxConnsFor: the default total leaves the sessions' and the
// daemon's descriptors free, and never less than one connection past
// root's share.
func TestMaxConnsFor(t *testing.T) {
	for _, c := range []struct {
		nofile             uint64
		open, sessions, rc int
		want               int
	}{
		{1 << 20, 20, 64, 16, 1<<20 - 20 - 64*fdsPerSession - daemonFDs},
		{1024, 20, 16, 16, 1024 - 20 - 16*fdsPerSession - daemonFDs},
		{1024, 20, 64, 16, 17},
		{1 << 62, 0, 0, 0, 1<<30 - daemonFDs},
	} {
		if got := maxConnsFor(c.nofile, c.open, c.sessions, c.rc); got != c.want {
			t.Errorf("maxConnsFor(%d, %d, %d, %d) = %d, want %d", c.nofile, c.open, c.sessions, c.rc, got, c.want)
		}
	}
}
