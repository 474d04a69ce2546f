// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
)

// daliArgs are a shuffle dali session's arguments with the largest
// initial_fill: a 64 MiB buffer.
var daliArgs = loader.ReaderArgs{BatchSize: 1, NumShards: 1, RandomShuffle: true, Shuffle: loader.ShuffleDALI, InitialFill: loader.MaxInitialFill}

// heldFromOS is the heap memory the runtime holds from the OS.
func heldFromOS() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapSys - ms.HeapReleased
}

// TestSamplerBudget: shuffle dali sessions' sample orders (64 MiB
// buffers) are admitted against MaxSamplerBytes: past it an open is
// refused with ErrNoSpace naming the budget and what is in use, a closed
// session gives its share back, and the memory goes back to the OS within
// seconds of the close (a second and a half on an idle machine). Before, sample orders were outside
// every budget (64 sessions: 4.8 GiB) and stayed with the process for
// minutes.
func TestSamplerBudget(t *testing.T) {
	const sessions = 8
	ds := tree(t)
	per := loader.SamplerBytes(loader.Sampling{N: len(ds.Samples), ReaderArgs: daliArgs})
	if per < loader.MaxInitialFill*4 {
		t.Fatalf("SamplerBytes of a dali session with initial_fill %d: %d, want at least its buffer", loader.MaxInitialFill, per)
	}
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"d": ds}, MaxSamplerBytes: sessions * per, MaxSessions: 64, MaxSessionsPerUID: 64})
	defer m.Stop()
	me := Caller{UID: os.Getuid(), GID: os.Getgid()}
	runtime.GC()
	before := heldFromOS()
	var ids []string
	for range sessions {
		o, err := m.Open(context.Background(), me, OpenParams{Dataset: "d", Request: loader.Request{ReaderArgs: daliArgs}})
		if err != nil {
			t.Fatalf("open %d: %v", len(ids), err)
		}
		ids = append(ids, o.ID)
	}
	for _, id := range ids { // every reader started: its buffer is filled
		if _, err := m.Next(t.Context(), me, id, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	open := heldFromOS()
	_, err := m.Open(context.Background(), me, OpenParams{Dataset: "d", Request: loader.Request{ReaderArgs: daliArgs}})
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "--max-sampler-mb") || !strings.Contains(err.Error(), "budget of") {
		t.Errorf("open past the sampler budget: %v, want ErrNoSpace naming the budget", err)
	}
	if used, budget := m.Samplers(); used != sessions*per || budget != sessions*per {
		t.Errorf("Samplers() = %d, %d; want %d in use of %d", used, budget, sessions*per, sessions*per)
	}
	for _, id := range ids {
		if err := m.Close(me, id); err != nil {
			t.Fatal(err)
		}
	}
	if used, _ := m.Samplers(); used != 0 {
		t.Errorf("%d bytes of sample order still reserved after every session closed", used)
	}
	if _, err := m.Open(context.Background(), me, OpenParams{Dataset: "d", Request: loader.Request{ReaderArgs: daliArgs}}); err != nil {
		t.Errorf("open after the others closed: %v", err)
	}
	// Back within 1.5 s on an idle machine (osFreer's runs a second
	// apart, each a full collection); a loaded one (the race detector, a
	// CI beside other work) stretches both: the test waits up to 5 s.
	closed := time.Now()
	after := heldFromOS()
	for after > before+uint64(per)+32<<20 && time.Since(closed) < 5*time.Second {
		time.Sleep(100 * time.Millisecond)
		after = heldFromOS()
	}
	t.Logf("heap held from the OS: %d MiB before, %d MiB with %d dali sessions open, %d MiB %.1f s after they closed (one open)",
		before>>20, open>>20, sessions, after>>20, time.Since(closed).Seconds())
	if after > before+uint64(per)+32<<20 {
		t.Errorf("%d MiB of heap still held from the OS 5 s after the sessions closed (%d MiB before they opened)", after>>20, before>>20)
	}
}
