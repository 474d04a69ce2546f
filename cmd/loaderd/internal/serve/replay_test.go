// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/session"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader"
)

// cpuTime returns the CPU time this process (the daemon runs in it) has
// used.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestReplayFloodStopsNoOtherUser: nobody opens sessions resumed with
// shuffle dali at the farthest epoch allowed, each a replay of 2^30
// samples (tens of seconds of a core): the daemon runs as many of them at
// once as its limit per uid (session.Config.MaxReplaysPerUID), not one
// per session, so the other users keep the other cores; another uid
// still reads at once, and nobody's sessions close at once, replaying or
// waiting to.
func TestReplayFloodStopsNoOtherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "the attacker connects as nobody (euid %d)", os.Geteuid())
	}
	const sessions = 4
	root := t.TempDir()
	for i := range 97 {
		p := filepath.Join(root, fmt.Sprintf("c%d", i%5), fmt.Sprintf("%03d.jpg", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, bytes.Repeat([]byte{byte(i)}, 500+i*61), 0o644)
	}
	m := testfs.MapDir(t, root)
	publicDataset(t, m)
	sock := filepath.Join(publicDir(t), "d.sock")
	serveWith(t, m, Config{SessionTimeout: time.Minute}, Listen{Socket: sock, Mode: 0o666})

	args := loader.ReaderArgs{BatchSize: 4, NumShards: 1, RandomShuffle: true, Shuffle: loader.ShuffleDALI, InitialFill: loader.DefaultInitialFill}
	st := loader.State{Version: loader.StateVersion, Sampling: loader.Sampling{N: len(m.Samples), ReaderArgs: args}, Epoch: loader.MaxReplaySamples / len(m.Samples)}
	attacker := connectAs(t, sock, nobodyWho)
	var ids []string
	for range sessions {
		var o wire.OpenResponse
		if code, msg := attacker.call("POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: args, State: &st}}, &o); code != http.StatusOK {
			t.Fatalf("open as nobody at epoch %d: %d %s", st.Epoch, code, msg)
		}
		ids = append(ids, o.ID)
	}

	// The replays run: the daemon's CPU use is what one uid may take.
	time.Sleep(200 * time.Millisecond)
	const window = 2 * time.Second
	c0, t0 := cpuTime(t), time.Now()
	time.Sleep(window)
	cores := float64(cpuTime(t)-c0) / float64(time.Since(t0))
	limit := session.DefaultMaxReplaysPerUID()
	t.Logf("%d sessions of nobody replaying: the daemon used %.2f cores (limit per uid: %d replays)", sessions, cores, limit)
	if cores > float64(limit)+0.5 {
		t.Errorf("%d sessions of one uid replaying took %.2f cores, want at most its %d replays at once", sessions, cores, limit)
	}

	// Another uid reads at once.
	victim := unixClient(sock)
	var o wire.OpenResponse
	start := time.Now()
	if code, raw := victim.call(t, "POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 1}}}, &o); code != http.StatusOK {
		t.Fatalf("root's open: %d %s", code, raw)
	}
	if code, raw := victim.call(t, "POST", "/v1/sessions/"+o.ID+"/next", nil, nil); code != http.StatusOK {
		t.Fatalf("root's next: %d %s", code, raw)
	}
	t.Logf("root's open and first batch: %s", time.Since(start))

	for _, id := range ids {
		start := time.Now()
		if code, msg := attacker.call("DELETE", "/v1/sessions/"+id, nil, nil); code != http.StatusNoContent {
			t.Errorf("close: %d %s", code, msg)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("closing a session replaying (or waiting to) took %s", took)
		}
	}
}
