// SPDX-License-Identifier: Apache-2.0

package session

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader"
)

// BenchmarkAuthorizeCached: an open's access decision for a caller whose
// verdict is cached, over a 1000-file ext4 dataset with a Watch guard
// (the decision includes the guard's poll and generation, and the
// ancestors' re-stat).
func BenchmarkAuthorizeCached(b *testing.B) {
	m, g := watchedDataset(b)
	v := newVerdicts(1, slog.New(slog.DiscardHandler))
	c := Caller{UID: nobody, GID: nobody}
	if err := v.authorize(context.Background(), "ds", 1, m, g, c); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := v.authorize(context.Background(), "ds", 1, m, g, c); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOpenAsNewCaller: Manager.Open and Close of a gds session, each
// by a caller with no verdict yet (another uid every time), over
// NVFEED_OPEN_FILES (default 20000) files of 4 KiB on ext4, warm:
// ms/open is what a rank's first open costs at that dataset size.
func BenchmarkOpenAsNewCaller(b *testing.B) {
	n := 20000
	if s := os.Getenv("NVFEED_OPEN_FILES"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	fs := testfs.New(b, testfs.Options{Type: "ext4", SizeMB: 1024, MkfsArgs: []string{"-b", "4096", "-N", strconv.Itoa(n + 1000)}})
	reachable(fs.Dir)
	body := make([]byte, 4096)
	for i := range n {
		fs.WriteFile(b, fmt.Sprintf("train/c%03d/%06d.jpg", i%100, i), body)
	}
	fs.Sync(b)
	m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		b.Fatal(err)
	}
	mgr := NewManager(Config{Datasets: map[string]*bmap.Map{"d": m}, Logger: slog.New(slog.DiscardHandler), MaxSessions: 1 << 20, MaxSessionsPerUID: 1 << 20})
	defer mgr.Stop()
	uid := 43117
	for b.Loop() {
		c := Caller{UID: uid, GID: uid}
		uid++
		o, err := mgr.Open(context.Background(), c, OpenParams{Dataset: "d", Request: loader.Request{Backend: "gds", ReaderArgs: loader.ReaderArgs{BatchSize: 64, NumShards: 8}}})
		if err != nil {
			b.Fatal(err)
		}
		mgr.Close(c, o.ID)
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/open")
}

// BenchmarkAdmitWarm: a session's per-batch access check (its
// loader.Options.Access) for a batch of 64 samples its caller has already
// opened, over a 1000-file ext4 dataset with a Watch guard: the read
// path's cost for a caller other than root (a poll of the watches, the
// generation, 64 bit tests, the ancestors re-stat'ed every
// ancestorsEvery).
func BenchmarkAdmitWarm(b *testing.B) {
	m, g := watchedDataset(b)
	admit := (&dataset{id: 1, name: "ds", m: m, guard: g}).access(Caller{UID: nobody, GID: nobody})
	batch := make([]int, 64)
	for i := range batch {
		batch[i] = i * 13 % len(m.Samples)
	}
	if r := admit(batch); r != nil {
		b.Fatal(r)
	}
	for b.Loop() {
		if r := admit(batch); r != nil {
			b.Fatal(r)
		}
	}
}

// watchedDataset maps a 1000-file ext4 dataset others may reach, with a Watch guard.
func watchedDataset(b *testing.B) (*bmap.Map, *fresh.Guard) {
	fs := testfs.New(b, testfs.Ext4())
	reachable(fs.Dir)
	for i := range 1000 {
		fs.WriteFile(b, fmt.Sprintf("train/c%02d/%04d.jpg", i%10, i), bytes.Repeat([]byte("x"), 8192))
	}
	fs.Sync(b)
	m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		b.Fatal(err)
	}
	g, err := fresh.Open(m, fresh.Watch, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.Close() })
	return m, g
}
