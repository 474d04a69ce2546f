// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/wds"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/internal/raw"
)

// wdsShards writes shards tars of per samples each on fs (PAX headers
// in the first, GNU in the others), each sample a .jpg of a random size
// up to 40 KiB, a .cls, and on every 7th a .TXT instead of the .cls;
// it returns the members' bytes by shard and name.
func wdsShards(t *testing.T, fs *testfs.FS, shards, per int) map[string][]byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(38, 1))
	want := map[string][]byte{}
	for s := range shards {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for i := range per {
			key := fmt.Sprintf("d%02d/s%05d", s, i)
			second := key + ".cls"
			if i%7 == 3 {
				second = key + ".TXT"
			}
			jpg := make([]byte, rng.IntN(40<<10))
			for j := range jpg {
				jpg[j] = byte(rng.Uint32())
			}
			for _, f := range []struct {
				name string
				data []byte
			}{{key + ".jpg", jpg}, {second, []byte(fmt.Sprint(i % 10))}} {
				h := &tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg, Format: tar.FormatGNU}
				if s == 0 {
					h.Format, h.PAXRecords = tar.FormatPAX, map[string]string{"comment": "x"}
				}
				if err := tw.WriteHeader(h); err != nil {
					t.Fatal(err)
				}
				tw.Write(f.data)
				want[fmt.Sprintf("%d/%s", s, f.name)] = f.data
			}
		}
		tw.Close()
		fs.WriteFile(t, fmt.Sprintf("shards/part-%03d.tar", s), buf.Bytes())
	}
	fs.Sync(t)
	return want
}

// openWDS maps fs's shards and selects ext.
func openWDS(t *testing.T, fs *testfs.FS, o wds.Options) *WebDataset {
	t.Helper()
	out := filepath.Join(t.TempDir(), "wds.bmap")
	if _, err := wds.Build(context.Background(), fs.Path("shards"), out, wds.BuildOptions{}); err != nil {
		t.Fatal(err)
	}
	m, err := wds.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	v, err := m.Select(o)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWebDataset(v)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// checkWDSBatch checks every output of b against the tar's member
// (want, by shard and name), "" where ext names none.
func checkWDSBatch(t *testing.T, w *WebDataset, want map[string][]byte, b *Batch, exts [][]string) {
	t.Helper()
	m := w.View().Map()
	k := w.Outputs()
	if len(b.Offsets) != k*b.Len() || len(b.Labels) != 0 {
		t.Fatalf("batch of %d: %d offsets, %d labels: want %d and 0", b.Len(), len(b.Offsets), len(b.Labels), k*b.Len())
	}
	for i, si := range b.Indices {
		s, err := m.Sample(w.View().Index(int(si)))
		if err != nil {
			t.Fatal(err)
		}
		for o := range k {
			var exp []byte
			for _, e := range exts[o] {
				if x, ok := want[fmt.Sprintf("%d/%s.%s", s.Shard, s.Key, e)]; ok {
					exp = x
					break
				}
			}
			if got := b.Output(i, o); !bytes.Equal(got, exp) {
				t.Fatalf("sample %d (%s) output %d: %d bytes, want %d (the member's)", si, s.Key, o, len(got), len(exp))
			}
			if off := b.Offsets[i*k+o] - b.base; len(exp) > 0 && off%4096 != mustComp(t, m, s, exts[o]).Offset%4096 {
				t.Fatalf("sample %d output %d at %d: not at its tar phase", si, o, off)
			}
		}
	}
}

func mustComp(t *testing.T, m *wds.Map, s wds.Sample, exts []string) wds.Component {
	for j := s.First; j < s.First+s.Count; j++ {
		c, err := m.Component(s, j)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range exts {
			if m.Exts()[c.Ext] == e {
				return c
			}
		}
	}
	t.Fatalf("sample %s has no %v", s.Key, exts)
	return wds.Component{}
}

// TestWebDatasetBackendsByteExact reads every sample's outputs of tar
// shards on ext4 with every built-in backend (file, gds, bam and both
// engines), shuffled and sharded with padding: each output equals its
// member's bytes, at its phase in the tar, the empty ones empty.
func TestWebDatasetBackendsByteExact(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	want := wdsShards(t, fs, 3, 40)
	// The third output is empty but in a TXT sample, whose one member
	// fills it and the second (an ext no member fills is refused).
	exts := [][]string{{"jpg"}, {"cls", "TXT"}, {"TXT"}}
	w := openWDS(t, fs, wds.Options{Ext: []string{"jpg", "cls;TXT", "TXT"}, CaseSensitive: true})
	if w.View().Len() != 120 {
		t.Fatalf("%d samples, want 120", w.View().Len())
	}
	shards := w.View().Map().Shards
	for _, be := range []struct{ backend, engine string }{{"file", ""}, {"gds", raw.EngineUring}, {"gds", raw.EnginePread}, {"bam", raw.EngineUring}} {
		t.Run(be.backend+"/"+be.engine, func(t *testing.T) {
			opts := map[string]any{}
			if be.engine != "" {
				opts["engine"] = be.engine
			}
			seen := map[int32]int{}
			for shard := range 2 {
				l, err := New(context.Background(), shards, Options{ReaderArgs: ReaderArgs{BatchSize: 9, NumShards: 2, ShardID: shard, RandomShuffle: true, Seed: 4, PadLastBatch: true},
					WebDataset: w, Backend: be.backend, BackendOptions: opts, PrefetchQueueDepth: 2})
				if err != nil {
					if strings.Contains(err.Error(), "io_uring") {
						t.Skipf("io_uring refused: %v", err)
					}
					t.Fatal(err)
				}
				if errs := eachBatch(l, func(b *Batch) {
					checkWDSBatch(t, w, want, b, exts)
					for _, si := range b.Indices {
						seen[si]++
					}
				}); len(errs) > 0 {
					t.Fatal(errs)
				}
				if st := l.Backend().Stats(); be.backend != "file" && st.Counter("raw_samples") == 0 {
					t.Errorf("no raw reads: %+v", st)
				}
				l.Close()
			}
			if len(seen) != 120 {
				t.Fatalf("the two shards read %d distinct samples, want 120", len(seen))
			}
		})
	}
}

// TestWebDatasetRewrittenTarFails rewrites a tar in place after mapping
// (same size, same inode, other bytes): every backend fails its members
// (a failed sample, its outputs empty), never serving its new bytes as
// the old members', and serves the other tars' samples.
func TestWebDatasetRewrittenTarFails(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	want := wdsShards(t, fs, 2, 20)
	w := openWDS(t, fs, wds.Options{Ext: []string{"jpg", "cls;TXT"}, CaseSensitive: true})
	p := fs.Path("shards/part-001.tar")
	old, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xEE}, len(old)-1024), 512); err != nil { // past the first header
		t.Fatal(err)
	}
	f.Sync()
	f.Close()
	shards := w.View().Map().Shards
	for _, backend := range []string{"file", "gds"} {
		t.Run(backend, func(t *testing.T) {
			l, err := New(context.Background(), shards, Options{ReaderArgs: ReaderArgs{BatchSize: 8}, WebDataset: w, Backend: backend, SkipErrors: true})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			failed := 0
			if errs := eachBatch(l, func(b *Batch) {
				for i, si := range b.Indices {
					s, _ := w.View().Map().Sample(int(si))
					for o := range 2 {
						if bytes.Contains(b.Output(i, o), bytes.Repeat([]byte{0xEE}, 16)) {
							t.Fatalf("sample %d (tar %d) output %d: the rewritten tar's bytes served", si, s.Shard, o)
						}
					}
					if s.Shard == 1 != (len(b.Failed) > 0 && containsInt(b.Failed, i)) {
						t.Fatalf("sample %d of tar %d: failed %v", si, s.Shard, b.Failed)
					}
				}
				for _, e := range b.Errors {
					if !errors.Is(e, bmap.ErrStale) {
						t.Errorf("failure not stale: %v", e)
					}
				}
				distinct := map[int32]bool{}
				for _, i := range b.Failed {
					distinct[b.Indices[i]] = true
				}
				if len(b.Errors) != len(distinct) {
					t.Errorf("%d errors for %d failed samples: want one a sample, whatever its outputs", len(b.Errors), len(distinct))
				}
				failed += len(b.Failed)
			}); len(errs) > 0 {
				t.Fatal(errs)
			}
			if failed != 20 {
				t.Fatalf("%d failed samples, want tar 1's 20", failed)
			}
		})
	}
	_ = want
}

func containsInt(s []int, x int) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

// TestWebDatasetResumeAndOrder: the computed permutation gives every
// sample once an epoch, a new order each epoch, the same on every rank
// (ranks disjoint), and a saved state resumes the exact sequence; the
// webdataset sampling differs from a file map's in its state.
func TestWebDatasetResumeAndOrder(t *testing.T) {
	s := Sampling{N: 1000, ReaderArgs: ReaderArgs{BatchSize: 32, NumShards: 3, RandomShuffle: true, Seed: 7}.withDefaults(), WebDataset: true}
	seen := map[int32]bool{}
	var e0 []int32
	for k := range 3 {
		s.ShardID = k
		o := s.Orders().Epoch(0, nil)
		if k == 0 {
			e0 = o
		}
		for _, i := range o {
			if seen[i] {
				t.Fatalf("sample %d twice in epoch 0", i)
			}
			seen[i] = true
		}
	}
	if len(seen) != 1000 {
		t.Fatalf("%d samples in epoch 0", len(seen))
	}
	s.ShardID = 0
	if e1 := s.Orders().Epoch(1, nil); fmt.Sprint(e1[:10]) == fmt.Sprint(e0[:10]) {
		t.Fatal("epoch 1 repeats epoch 0's order")
	}
	if SamplerBytes(s) > 4*32 {
		t.Fatalf("SamplerBytes %d: not O(1)", SamplerBytes(s))
	}
	// batchAt and the listed epoch agree, padding included.
	s.PadLastBatch = true
	full := s.Orders().Epoch(2, nil)
	var got []int32
	for b := range s.EpochBatches(2) {
		got = s.batchAt(2, b, got)
	}
	if fmt.Sprint(got) != fmt.Sprint(full) || len(full) != 352 || full[351] != full[333] {
		t.Fatalf("batchAt %v\nepoch  %v", got, full)
	}
}

// TestWebDatasetSlotBytes: the slot size from the map's index holds any
// batch of the view: at least the sum of its batch-size largest
// samples' rooms (a scan of every sample, as NewWebDataset made before),
// and exactly that where only one output's sizes vary.
func TestWebDatasetSlotBytes(t *testing.T) {
	p := filepath.Join(t.TempDir(), "m.bmap")
	w, err := wds.NewWriter(p)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var off int64 = 512
	for i := range 3000 {
		names := []string{"x.jpg", "x.cls"}
		if i%3 == 0 {
			names = append(names, "x.png")
		}
		var offs, sizes []int64
		for _, name := range names {
			size := int64(1)
			if name != "x.cls" {
				size = 1 + rng.Int64N(40000)
			}
			offs, sizes = append(offs, off), append(sizes, size)
			off += (size+511)&^511 + 512
		}
		if err := w.Sample(strconv.Itoa(i), names, offs, sizes); err != nil {
			t.Fatal(err)
		}
	}
	shards := &bmap.Map{Version: 2, Root: "/tars", Reader: bmap.ReaderFile, Listed: true, Samples: []bmap.Sample{{Path: "a.tar", Size: off}}}
	if err := w.Close(shards); err != nil {
		t.Fatal(err)
	}
	m, err := wds.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, tc := range []struct {
		o     wds.Options
		exact bool // one output's sizes vary
	}{
		{wds.Options{Ext: []string{"jpg", "cls"}, CaseSensitive: true}, true},
		{wds.Options{Ext: []string{"png", "cls"}, CaseSensitive: true, Missing: wds.MissingSkip}, true},
		{wds.Options{Ext: []string{"jpg;png", "cls"}, CaseSensitive: true}, true},
		{wds.Options{Ext: []string{"jpg", "jpg"}, CaseSensitive: true}, true},
		{wds.Options{Ext: []string{"jpg", "png"}, CaseSensitive: true}, false},
	} {
		v, err := m.Select(tc.o)
		if err != nil {
			t.Fatal(err)
		}
		wd, err := NewWebDataset(v)
		if err != nil {
			t.Fatal(err)
		}
		var rooms []int64
		comps := make([]int, v.Outputs())
		for i := range v.Len() {
			s, err := v.Sample(i, comps)
			if err != nil {
				t.Fatal(err)
			}
			var n int64
			for _, j := range comps {
				if j >= 0 {
					c, _ := m.Component(s, j)
					_, r := room(&bmap.Sample{Offset: c.Offset, Size: c.Size})
					if wr := wds.Room(c.Offset, c.Size); wr != r {
						t.Fatalf("wds.Room(%d, %d) = %d, the loader's room %d", c.Offset, c.Size, wr, r)
					}
					n += r
				}
			}
			rooms = append(rooms, n)
		}
		slices.SortFunc(rooms, func(a, b int64) int { return int(b - a) })
		for _, b := range []int{1, 7, 64, 999, 5000} {
			var want int64
			for _, r := range rooms[:min(b, len(rooms))] {
				want += r
			}
			want = max(want, backend.Align)
			if got := wd.SlotBytes(b); got < want || (tc.exact && got != want) {
				t.Errorf("%q skip=%v batch %d: slot %d, the largest rooms take %d", tc.o.Ext, tc.o.Missing == wds.MissingSkip, b, got, want)
			}
		}
	}
}
