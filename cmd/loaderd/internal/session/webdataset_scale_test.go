// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/wds"
	"github.com/nvfeed/nvfeed/loader"
)

// scaleMap writes a webdataset map of n samples over sparse tars in dir
// (a million samples a tar), each sample a 1000-byte .jpg and a 1-byte
// .cls, and returns its path.
func scaleMap(t *testing.T, dir string, n int) string {
	t.Helper()
	shards := max(1, n/1_000_000)
	per := (n + shards - 1) / shards
	tars := filepath.Join(dir, "tars")
	if err := os.MkdirAll(tars, 0o755); err != nil {
		t.Fatal(err)
	}
	sm := &bmap.Map{Version: 2, Root: tars, Reader: bmap.ReaderFile, Listed: true}
	for i := range shards {
		name := fmt.Sprintf("part-%05d.tar", i)
		size := int64(per)*3072 + 1024
		f, err := os.Create(filepath.Join(tars, name))
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(size) // sparse: zeros
		var st unix.Stat_t
		unix.Fstat(int(f.Fd()), &st)
		f.Close()
		sm.Samples = append(sm.Samples, bmap.Sample{Path: name, Size: size, Inode: st.Ino, MtimeNs: st.Mtim.Nano(), CtimeNs: st.Ctim.Nano(), Reason: bmap.NoExtents})
	}
	p := filepath.Join(dir, "scale.bmap")
	w, err := wds.NewWriter(p)
	if err != nil {
		t.Fatal(err)
	}
	names, offs, sizes := []string{"x.jpg", "x.cls"}, make([]int64, 2), []int64{1000, 1}
	var key []byte
	for i := range n {
		if i%per == 0 {
			w.Shard(i / per)
		}
		local := int64(i % per)
		key = strconv.AppendInt(key[:0], int64(i), 10)
		offs[0], offs[1] = local*3072+512, local*3072+2048
		if err := w.Sample(string(key), names, offs, sizes); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(sm); err != nil {
		t.Fatal(err)
	}
	return p
}

// procStatus returns a /proc/self/status field in KiB.
func procStatus(field string) int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field+":" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return -1
}

// TestWebDatasetScale opens a generated webdataset map of
// NVFEED_WDS_SAMPLES samples (100000000 for the figures in
// docs/daemon.md) in a session manager, serves a shuffled epoch's first
// batch, resumes exactly from a saved state, and measures the memory a
// session holds beside its batch memory: heap and anonymous RSS with 1
// and with 8 sessions open.
func TestWebDatasetScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("NVFEED_WDS_SAMPLES"))
	if n == 0 {
		t.Skip("NVFEED_WDS_SAMPLES not set (100000000 for the 100 M figures)")
	}
	dir := os.Getenv("NVFEED_WDS_DIR")
	if dir == "" {
		dir = t.TempDir()
	} else {
		dir = filepath.Join(dir, "wdsscale")
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	t0 := time.Now()
	path := scaleMap(t, dir, n)
	built := time.Since(t0)
	st, _ := os.Stat(path)
	t0 = time.Now()
	_, wm, err := LoadMap(path)
	if err != nil {
		t.Fatal(err)
	}
	loaded := time.Since(t0)
	mgr := NewManager(Config{WebDatasets: map[string]*wds.Map{"big": wm}, MaxLockedBytes: 1 << 36, MaxSessions: 64, MaxSessionsPerUID: 64,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer mgr.Stop()
	root := Caller{UID: 0, GID: 0}
	p := OpenParams{Dataset: "big", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 64, NumShards: 1, RandomShuffle: true, Seed: 38}, Backend: "file"}, Ext: []string{"jpg", "cls"}}
	ctx := context.Background()
	t0 = time.Now()
	a, err := mgr.Open(context.Background(), root, p)
	if err != nil {
		t.Fatal(err)
	}
	firstOpen := time.Since(t0)
	t0 = time.Now()
	b0, err := mgr.Next(ctx, root, a.ID, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	firstBatch := time.Since(t0)
	if a.Components != 2 || a.State.Sampling.N != n || len(b0.Indices) != 64 || len(b0.Lengths) != 128 || b0.Lengths[0] != 1000 || b0.Lengths[1] != 1 {
		t.Fatalf("open %+v, first batch %d samples, lengths %v", a, len(b0.Indices), b0.Lengths[:4])
	}
	if slices.IsSorted(b0.Indices) {
		t.Fatalf("the first batch is not shuffled: %v", b0.Indices)
	}
	saved, err := mgr.State(root, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	b1, err := mgr.Next(ctx, root, a.ID, []int{b0.Slot}, nil)
	if err != nil {
		t.Fatal(err)
	}
	mgr.Close(root, a.ID)
	// The memory of sessions beyond the first (the selection made).
	runtime.GC()
	var m0, m1, m8 runtime.MemStats
	runtime.ReadMemStats(&m0)
	rss0 := procStatus("RssAnon")
	pr := p
	pr.State = &saved
	t0 = time.Now()
	r, err := mgr.Open(context.Background(), root, pr)
	if err != nil {
		t.Fatal(err)
	}
	resumeOpen := time.Since(t0)
	rb, err := mgr.Next(ctx, root, r.ID, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rb.Indices, b1.Indices) || rb.Iteration != 1 {
		t.Fatalf("resumed batch %d %v, want batch 1 %v", rb.Iteration, rb.Indices[:8], b1.Indices[:8])
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	rss1 := procStatus("RssAnon")
	ids := []string{r.ID}
	for range 7 {
		o, err := mgr.Open(context.Background(), root, p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := mgr.Next(ctx, root, o.ID, nil, nil); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, o.ID)
	}
	runtime.GC()
	runtime.ReadMemStats(&m8)
	rss8 := procStatus("RssAnon")
	locked, _ := mgr.Locked()
	for _, id := range ids {
		mgr.Close(root, id)
	}
	kib := func(a, b uint64) int64 { return (int64(b) - int64(a)) / 1024 }
	t.Logf("%d samples, %d tars: map %d bytes (%.1f B/sample), written in %v; loaded in %v; first open (its ext selection) %v; first batch %v; a resumed open %v",
		n, len(wm.Shards.Samples), st.Size(), float64(st.Size())/float64(n), built.Round(time.Millisecond), loaded.Round(time.Microsecond), firstOpen.Round(time.Microsecond), firstBatch.Round(time.Microsecond), resumeOpen.Round(time.Microsecond))
	t.Logf("memory besides batch memory (%d KiB for 8 sessions): 1 session heap +%d KiB, RssAnon +%d KiB; 8 sessions heap +%d KiB, RssAnon +%d KiB: %d KiB heap per session",
		locked/1024, kib(m0.HeapAlloc, m1.HeapAlloc), rss1-rss0, kib(m0.HeapAlloc, m8.HeapAlloc), rss8-rss0, kib(m1.HeapAlloc, m8.HeapAlloc)/7)
}
