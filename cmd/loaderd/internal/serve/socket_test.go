// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
)

// runServer starts a daemon on sock and returns a function that stops it
// and returns Run's error.
func runServer(t *testing.T, m *bmap.Map, l Listen) func() error {
	t.Helper()
	srv := New(Config{Datasets: map[string]*bmap.Map{"ds": m}, SessionTimeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, l) }()
	return func() error { cancel(); return <-done }
}

// The socket appears only when a client can use it: listening, with its
// mode. A client polling for the path (as LoaderSource and the test
// fixtures do) must never see "connection refused" or the wrong mode.
func TestSocketReadyWhenItAppears(t *testing.T) {
	m := start(t, time.Minute).m
	dir := t.TempDir()
	for i := 0; i < 30; i++ {
		sock := filepath.Join(dir, "r.sock")
		stop := runServer(t, m, Listen{Socket: sock, Mode: 0o666})
		var fi os.FileInfo
		var err error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			if fi, err = os.Stat(sock); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("round %d: socket never appeared: %v", i, err)
		}
		c, derr := net.Dial("unix", sock)
		if derr != nil {
			t.Fatalf("round %d: the socket exists but refuses: %v", i, derr)
		}
		c.Close()
		if fi.Mode().Perm() != 0o666 {
			t.Fatalf("round %d: socket appeared with mode %04o, want 0666", i, fi.Mode().Perm())
		}
		if err := stop(); err != nil {
			t.Fatalf("round %d: Run: %v", i, err)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Fatalf("round %d: left behind in the socket directory: %v", i, ents)
		}
	}
}

func TestSocketPathConflicts(t *testing.T) {
	f := start(t, time.Minute)
	dir := t.TempDir()
	// A stale socket (a killed daemon's) is replaced.
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	stop := runServer(t, f.m, Listen{Socket: stale})
	time.Sleep(50 * time.Millisecond)
	if err := stop(); err != nil {
		t.Errorf("over a stale socket: %v", err)
	}
	// A live daemon's socket and a regular file are refused, and kept.
	plain := filepath.Join(dir, "plain")
	os.WriteFile(plain, []byte("keep"), 0o644)
	for _, tt := range []struct{ path, want string }{
		{f.sock, "in use by another daemon"},
		{plain, "is not a socket"},
	} {
		stop := runServer(t, f.m, Listen{Socket: tt.path})
		if err := stop(); err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), tt.path) {
			t.Errorf("%s: Run: %v, want an error naming it and saying %q", tt.path, err, tt.want)
		}
	}
	if b, _ := os.ReadFile(plain); string(b) != "keep" {
		t.Errorf("a refused path was changed: %q", b)
	}
	if code := f.call(t, "GET", "/healthz", nil, nil); code != 200 {
		t.Errorf("the first daemon after a second one was refused its socket: %d", code)
	}
}
