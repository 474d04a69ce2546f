// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

// TestSocketDirectory: a missing socket directory is created, mode 0755
// whatever the umask; one that cannot be created is named in the error
// (not the daemon's temporary socket name).
func TestSocketDirectory(t *testing.T) {
	m := start(t, time.Minute).m
	base := t.TempDir()
	if err := os.WriteFile(filepath.Join(base, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, dir string
		err       string // "" serves
	}{
		{"missing", filepath.Join(base, "run", "loaderd"), ""},
		{"exists", base, ""},
		{"under a file", filepath.Join(base, "file", "loaderd"), filepath.Join(base, "file", "loaderd")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := filepath.Join(tt.dir, "d.sock")
			stop := runServer(t, m, Listen{Socket: sock, Mode: 0o660})
			if tt.err != "" {
				err := stop()
				if err == nil || !strings.Contains(err.Error(), "directory "+tt.err) || strings.Contains(err.Error(), "~") {
					t.Fatalf("Run: %v, want an error naming the directory %s", err, tt.err)
				}
				return
			}
			waitSocket(t, sock)
			defer func() {
				if err := stop(); err != nil {
					t.Error(err)
				}
			}()
			if fi, err := os.Stat(tt.dir); err != nil {
				t.Error(err)
			} else if tt.dir != base && fi.Mode().Perm() != 0o755 {
				t.Errorf("the socket's directory has mode %v, want 0755", fi.Mode().Perm())
			}
		})
	}
}

// waitSocket waits for sock to appear.
func waitSocket(t *testing.T, sock string) {
	t.Helper()
	testenv.Eventually(t, "the socket "+sock, func() bool { _, err := os.Stat(sock); return err == nil })
}

// TestNotifySystemd: with NOTIFY_SOCKET set (a path or an abstract name),
// the daemon sends READY=1 once its socket accepts connections, RELOADING=1
// then READY=1 around a reload, and STOPPING=1 when it stops.
func TestNotifySystemd(t *testing.T) {
	root := t.TempDir()
	mapPath := filepath.Join(t.TempDir(), "m.bmap")
	for i := range 4 {
		p := filepath.Join(root, "c", fmt.Sprintf("%d.jpg", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, bytes.Repeat([]byte{byte(i)}, 100), 0o644)
	}
	m := testfs.MapDir(t, root)
	if _, err := bmap.WriteFile(mapPath, m, bmap.FormatBinary); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{filepath.Join(t.TempDir(), "notify"), fmt.Sprintf("@nvfeed-test-notify-%d", os.Getpid())} {
		t.Run(addr[:1], func(t *testing.T) {
			ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			t.Setenv("NOTIFY_SOCKET", addr)
			sock := filepath.Join(t.TempDir(), "d.sock")
			srv := New(Config{Datasets: map[string]*bmap.Map{"ds": m}, SessionTimeout: time.Minute,
				MapFiles: func() (map[string]string, error) { return map[string]string{"ds": mapPath}, nil }})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- srv.Run(ctx, Listen{Socket: sock}) }()
			next := func() string {
				t.Helper()
				buf := make([]byte, 4096)
				ln.SetReadDeadline(time.Now().Add(10 * time.Second))
				n, err := ln.Read(buf)
				if err != nil {
					t.Fatalf("no notification: %v", err)
				}
				return string(buf[:n])
			}
			msg := next()
			if !strings.HasPrefix(msg, "READY=1\n") || !strings.Contains(msg, "STATUS=serving datasets ds") {
				t.Fatalf("first notification %q, want READY=1 and a STATUS", msg)
			}
			// Ready means ready: a client connects and is answered at once.
			c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", sock)
			}}}
			defer c.CloseIdleConnections()
			resp, err := c.Get("http://d/healthz")
			if err != nil {
				t.Fatalf("READY=1 came before the socket accepted connections: %v", err)
			}
			resp.Body.Close()
			res, err := RequestReload(context.Background(), sock)
			if err != nil || len(res.Datasets) != 1 || res.Datasets[0].Outcome != "reloaded" {
				t.Fatalf("reload: %+v %v", res, err)
			}
			if msg := next(); !strings.HasPrefix(msg, "RELOADING=1\nMONOTONIC_USEC=") {
				t.Errorf("before a reload: %q, want RELOADING=1", msg)
			}
			if msg := next(); !strings.HasPrefix(msg, "READY=1\n") {
				t.Errorf("after a reload: %q, want READY=1", msg)
			}
			cancel()
			if msg := next(); !strings.HasPrefix(msg, "STOPPING=1") {
				t.Errorf("at shutdown: %q, want STOPPING=1", msg)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestDatasetsAndReloadAccess: any client may list the datasets (counts,
// no path of a file or session); only root on the unix socket may reload.
func TestDatasetsAndReloadAccess(t *testing.T) {
	a := newAttackFS(t)
	sock := daemon(t, a.build(t))
	for _, tt := range []struct {
		name       string
		w          who
		wantReload int
	}{
		{"nobody", nobodyWho, http.StatusForbidden},
		{"root", who{0, 0, nil}, http.StatusConflict}, // allowed; this daemon was given maps, not map files
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := connectAs(t, sock, tt.w)
			var d wire.DatasetsResponse
			if code, msg := c.call("GET", "/v1/datasets", nil, &d); code != http.StatusOK {
				t.Fatalf("GET /v1/datasets: %d %s", code, msg)
			}
			if len(d.Datasets) != 1 || d.Datasets[0].Name != "ds" || d.Datasets[0].Samples == nil || *d.Datasets[0].Samples == 0 {
				t.Errorf("datasets %+v", d)
			}
			if code, msg := c.call("POST", "/v1/reload", nil, nil); code != tt.wantReload {
				t.Errorf("POST /v1/reload: %d %s, want %d", code, msg, tt.wantReload)
			}
		})
	}
}
