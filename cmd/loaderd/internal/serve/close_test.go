// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bytes"
	"context"
	"fmt"
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
	"github.com/nvfeed/nvfeed/loader"
)

// throwawayWho is a uid no account has: a user the daemon knows only by
// its connection's credentials.
var throwawayWho = who{43117, 43117, nil}

// replayingDataset is a public dataset of 97 files and the state of a
// shuffle dali session resumed at the farthest epoch allowed: its first
// batch waits for a replay of 2^30 samples (tens of seconds of a core).
func replayingDataset(t *testing.T) (*bmap.Map, loader.ReaderArgs, loader.State) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "the clients connect as other users (euid %d)", os.Geteuid())
	}
	root := t.TempDir()
	for i := range 97 {
		p := filepath.Join(root, fmt.Sprintf("c%d", i%5), fmt.Sprintf("%03d.jpg", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, bytes.Repeat([]byte{byte(i)}, 500+i*61), 0o644)
	}
	m := testfs.MapDir(t, root)
	publicDataset(t, m)
	args := loader.ReaderArgs{BatchSize: 4, NumShards: 1, RandomShuffle: true, Shuffle: loader.ShuffleDALI, InitialFill: loader.DefaultInitialFill}
	st := loader.State{Version: loader.StateVersion, Sampling: loader.Sampling{N: len(m.Samples), ReaderArgs: args}, Epoch: loader.MaxReplaySamples / len(m.Samples)}
	return m, args, st
}

// stoppableDaemon serves m as "ds" on a socket anyone may connect to and
// returns it with a stop that ends Run and says how long Run took to
// return (its error fails the test).
func stoppableDaemon(t *testing.T, m *bmap.Map) (sock string, stop func() time.Duration) {
	t.Helper()
	sock = filepath.Join(publicDir(t), "d.sock")
	srv := New(Config{Datasets: map[string]*bmap.Map{"ds": m}, SessionTimeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, Listen{Socket: sock, Mode: 0o666}) }()
	stopped := false
	stop = func() time.Duration {
		if stopped {
			return 0
		}
		stopped = true
		start := time.Now()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		return time.Since(start)
	}
	t.Cleanup(func() { stop() })
	testenv.Eventually(t, "the daemon's socket", func() bool { _, err := os.Stat(sock); return err == nil })
	return sock, stop
}

// answer is a request's outcome, from another goroutine.
type answer struct {
	code int
	msg  string
	at   time.Time
}

// pendingNext asks for the session's next batch on a connection of its
// own and returns where its answer comes; it waits until the request has
// waited for a while (the replay holds it).
func pendingNext(t *testing.T, sock string, w who, id string) <-chan answer {
	t.Helper()
	c := connectAs(t, sock, w)
	out := make(chan answer, 1)
	go func() {
		var nb wire.NextResponse
		code, msg := c.call("POST", "/v1/sessions/"+id+"/next", nil, &nb)
		out <- answer{code, msg, time.Now()}
	}()
	select {
	case a := <-out:
		t.Fatalf("next of a session replaying 2^30 samples answered at once: %d %s", a.code, a.msg)
	case <-time.After(500 * time.Millisecond):
	}
	return out
}

// closeBound is how soon a close, or the daemon's stop, must end a
// pending next: before, they waited for the replay (12.7–18 s).
const closeBound = 2 * time.Second

// TestCloseEndsAWaitingNext: a shuffle dali session resumed at a far
// epoch (a long replay) has a next pending on one connection; DELETE on
// another returns at once, and the pending next answers at once with 404
// saying the session was closed while it waited. As nobody and as a uid
// no account has.
func TestCloseEndsAWaitingNext(t *testing.T) {
	m, args, st := replayingDataset(t)
	sock, _ := stoppableDaemon(t, m)
	for _, w := range []who{nobodyWho, throwawayWho} {
		t.Run(fmt.Sprint(w.uid), func(t *testing.T) {
			owner := connectAs(t, sock, w)
			var o wire.OpenResponse
			if code, msg := owner.call("POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: args, State: &st}}, &o); code != http.StatusOK {
				t.Fatalf("open at epoch %d: %d %s", st.Epoch, code, msg)
			}
			pending := pendingNext(t, sock, w, o.ID)
			start := time.Now()
			closed := make(chan answer, 1)
			go func() {
				code, msg := owner.call("DELETE", "/v1/sessions/"+o.ID, nil, nil)
				closed <- answer{code, msg, time.Now()}
			}()
			select {
			case a := <-closed:
				if a.code != http.StatusNoContent {
					t.Errorf("DELETE: %d %s", a.code, a.msg)
				}
			case <-time.After(5 * closeBound):
				t.Fatalf("DELETE had no answer %s after it was sent, with a next pending in a replay", 5*closeBound)
			}
			took := time.Since(start)
			t.Logf("DELETE with a next pending in a replay: %s", took)
			if took > closeBound {
				t.Errorf("DELETE waited %s for the pending next's replay, want at most %s", took, closeBound)
			}
			select {
			case a := <-pending:
				t.Logf("the pending next: %d %s (%s after the DELETE began)", a.code, a.msg, a.at.Sub(start))
				if a.code != http.StatusNotFound || !strings.Contains(a.msg, "was closed (closed by client) while this request waited") {
					t.Errorf("the pending next answered %d %q, want 404 saying the session was closed while it waited", a.code, a.msg)
				}
			case <-time.After(closeBound):
				t.Errorf("the pending next had no answer %s after its session was closed", closeBound)
			}
		})
	}
}

// TestShutdownEndsAWaitingNext: the daemon stopping (SIGTERM: Run's
// context) with a next pending in a replay answers it at once (404,
// saying the daemon is shutting down) and returns well within its stop
// timeout; before, Run waited 5 s for the request and then for the
// replay.
func TestShutdownEndsAWaitingNext(t *testing.T) {
	m, args, st := replayingDataset(t)
	sock, stop := stoppableDaemon(t, m)
	owner := connectAs(t, sock, throwawayWho)
	var o wire.OpenResponse
	if code, msg := owner.call("POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: args, State: &st}}, &o); code != http.StatusOK {
		t.Fatalf("open at epoch %d: %d %s", st.Epoch, code, msg)
	}
	pending := pendingNext(t, sock, throwawayWho, o.ID)
	took := stop()
	t.Logf("the daemon stopped in %s with a next pending in a replay", took)
	if took > closeBound {
		t.Errorf("stopping the daemon took %s with a next pending in a replay, want at most %s", took, closeBound)
	}
	select {
	case a := <-pending:
		if a.code != http.StatusNotFound || !strings.Contains(a.msg, "daemon shutting down") {
			t.Errorf("the pending next answered %d %q, want 404 saying the daemon is shutting down", a.code, a.msg)
		}
	case <-time.After(closeBound):
		t.Errorf("the pending next had no answer %s after the daemon stopped", closeBound)
	}
}
