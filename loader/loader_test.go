// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/faults"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// makeDataset writes n files in DALI layout with sizes around mean bytes
// (some tiny, some multi-block, one empty) and returns a map of them built
// without FIEMAP (the file backend needs only paths and sizes).
func makeDataset(t testing.TB, n, classes, mean int) *bmap.Map {
	t.Helper()
	root := t.TempDir()
	rng := rand.New(rand.NewPCG(uint64(n), 9))
	for i := 0; i < n; i++ {
		size := int(rng.ExpFloat64() * float64(mean))
		switch i % 17 {
		case 3:
			size = 0
		case 5:
			size = 4096
		case 7:
			size = 1
		}
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		dir := filepath.Join(root, fmt.Sprintf("c%03d", i%classes))
		os.MkdirAll(dir, 0o755)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d.jpg", i)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return testfs.MapDir(t, root)
}

// checkBatch compares every sample of b with its file.
func checkBatch(t testing.TB, m *bmap.Map, b *Batch) {
	t.Helper()
	for i := 0; i < b.Len(); i++ {
		s := &m.Samples[b.Indices[i]]
		want, err := os.ReadFile(filepath.Join(m.Root, s.Path))
		if err != nil {
			t.Fatal(err)
		}
		if got := b.Sample(i); !bytes.Equal(got, want) {
			t.Fatalf("epoch %d batch %d pos %d: sample %d (%s): %d bytes differ from the file's %d", b.Epoch, b.Iteration, i, b.Indices[i], s.Path, len(got), len(want))
		}
		if b.Labels[i] != s.Label || b.Offsets[i]%backend.Align != 0 {
			t.Fatalf("sample %d: label %d (want %d), offset %d", b.Indices[i], b.Labels[i], s.Label, b.Offsets[i])
		}
	}
}

// eachBatch calls fn on every batch of one epoch, releasing each after,
// and returns the errors Next returned on the way.
func eachBatch(l *Loader, fn func(b *Batch)) []error {
	var errs []error
	for {
		b, err := l.Next(context.Background())
		if err == io.EOF {
			return errs
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		fn(b)
		b.Release()
	}
}

// collectEpoch reads one epoch and returns its sample indices, checking
// bytes.
func collectEpoch(t testing.TB, l *Loader, m *bmap.Map, check bool) []int32 {
	t.Helper()
	var got []int32
	if errs := eachBatch(l, func(b *Batch) {
		if check {
			checkBatch(t, m, b)
		}
		got = append(got, b.Indices...)
	}); len(errs) > 0 {
		t.Fatal(errs)
	}
	return got
}

func TestByteExact(t *testing.T) {
	m := makeDataset(t, 300, 7, 20_000)
	tests := []struct {
		name string
		o    Options
	}{
		{"buffered", Options{ReaderArgs: ReaderArgs{BatchSize: 16, RandomShuffle: true, Seed: 5}, PrefetchQueueDepth: 3}},
		{"direct", Options{ReaderArgs: ReaderArgs{BatchSize: 16, RandomShuffle: true, Seed: 5}, PrefetchQueueDepth: 3, BackendOptions: map[string]any{"direct": true}}},
		{"direct shard 1 of 2 padded", Options{ReaderArgs: ReaderArgs{BatchSize: 64, NumShards: 2, ShardID: 1, PadLastBatch: true}, PrefetchQueueDepth: 4, BackendOptions: map[string]any{"direct": true, "workers": 3}}},
		{"batch 1", Options{ReaderArgs: ReaderArgs{BatchSize: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := New(context.Background(), m, tt.o)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			smp := l.Sampling()
			for e := 0; e < 3; e++ {
				got := collectEpoch(t, l, m, true)
				want, _ := smp.EpochOrder(e, nil, nil)
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("epoch %d: loader order differs from the sampler's", e)
				}
			}
		})
	}
}

func TestResume(t *testing.T) {
	m := makeDataset(t, 101, 5, 3000)
	o := Options{ReaderArgs: ReaderArgs{BatchSize: 8, NumShards: 3, ShardID: 1, RandomShuffle: true, Seed: 3}, PrefetchQueueDepth: 2}
	// The reference sequence: 4 epochs, EOFs included.
	seq := func(l *Loader, steps int) []string { return seqOf(t, l, steps) }
	ref, err := New(context.Background(), m, o)
	if err != nil {
		t.Fatal(err)
	}
	want := seq(ref, 20)
	ref.Close()
	for _, cut := range []int{0, 1, 4, 5, 6, 9, 15} {
		l, _ := New(context.Background(), m, o)
		head := seq(l, cut)
		st := l.State()
		l.Close()
		o2 := o
		o2.State = &st
		r, err := New(context.Background(), m, o2)
		if err != nil {
			t.Fatal(err)
		}
		tail := seq(r, 20-cut)
		r.Close()
		if got := append(head, tail...); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("cut at %d (state %+v):\n got %v\nwant %v", cut, st, got, want)
		}
	}
	// A state from other options is refused, naming the difference.
	st := State{Version: StateVersion, Sampling: Sampling{N: 101, ReaderArgs: ReaderArgs{BatchSize: 9, NumShards: 3, ShardID: 1, RandomShuffle: true, Seed: 3}}}
	o.State = &st
	if _, err := New(context.Background(), m, o); !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), "batch_size 9 (now 8)") {
		t.Errorf("mismatched state: err = %v", err)
	}
	// A state of another wire version is refused, naming the versions.
	st = State{Version: StateVersion + 1, Sampling: Sampling{N: 101, ReaderArgs: ReaderArgs{BatchSize: 8, NumShards: 3, ShardID: 1, RandomShuffle: true, Seed: 3}}}
	if _, err := New(context.Background(), m, o); !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), fmt.Sprintf("version %d", StateVersion)) {
		t.Errorf("state of another version: err = %v", err)
	}
}

func TestMemoryFlat(t *testing.T) {
	m := makeDataset(t, 200, 4, 2000)
	l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 32, RandomShuffle: true}, PrefetchQueueDepth: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	heap := func() (uint64, int) {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc, runtime.NumGoroutine()
	}
	for e := 0; e < 5; e++ {
		collectEpoch(t, l, m, false)
	}
	h0, g0 := heap()
	for e := 0; e < 60; e++ {
		collectEpoch(t, l, m, false)
	}
	h1, g1 := heap()
	if h1 > h0+256<<10 || g1 > g0+2 {
		t.Errorf("after 60 more epochs: heap %d -> %d bytes, goroutines %d -> %d", h0, h1, g0, g1)
	}
}

func TestReadErrorsNameTheSample(t *testing.T) {
	m := makeDataset(t, 40, 2, 5000)
	victim := &m.Samples[9]
	os.Remove(filepath.Join(m.Root, victim.Path))
	grown := &m.Samples[20]
	os.WriteFile(filepath.Join(m.Root, grown.Path), make([]byte, grown.Size+5000), 0o644)
	l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 4}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	good := 0
	errs := eachBatch(l, func(b *Batch) {
		checkBatch(t, m, b)
		good += b.Len()
	})
	if len(errs) != 2 || good != 40-8 {
		t.Fatalf("errors %v, %d good samples; want 2 errors and 32 good samples", errs, good)
	}
	var se *backend.SampleError
	if !errors.As(errs[0], &se) || se.Index != 9 || !strings.Contains(errs[0].Error(), victim.Path) || !errors.Is(errs[0], os.ErrNotExist) {
		t.Errorf("vanished file: %v", errs[0])
	}
	if !errors.Is(errs[1], backend.ErrShortRead) || !strings.Contains(errs[1].Error(), grown.Path) {
		t.Errorf("grown file: %v", errs[1])
	}
}

func TestCloseWhileReading(t *testing.T) {
	m := makeDataset(t, 500, 5, 50_000)
	for i := 0; i < 5; i++ {
		l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 64}, PrefetchQueueDepth: 4, BackendOptions: map[string]any{"workers": 2}})
		if err != nil {
			t.Fatal(err)
		}
		b, err := l.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		_ = b // held, not released: Close must not wait for it
		done := make(chan error)
		go func() { done <- l.Close() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Close hung")
		}
		if _, err := l.Next(context.Background()); !errors.Is(err, ErrClosed) {
			t.Errorf("Next after Close: %v", err)
		}
	}
	// A cancelled context ends a blocked Next promptly.
	l, _ := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 64}, PrefetchQueueDepth: 1, Slots: 2})
	defer l.Close()
	b1, _ := l.Next(context.Background())
	b2, _ := l.Next(context.Background())
	_, _ = b1, b2 // both slots held: the producer cannot go on
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Next with both slots held: err = %v, want deadline", err)
	}
	b1.Release()
	if b, err := l.Next(context.Background()); err != nil || b.Iteration != 2 {
		t.Errorf("after release: %v %v", b, err)
	}
}

func TestOptionErrors(t *testing.T) {
	m := makeDataset(t, 10, 2, 100)
	tests := []struct {
		o    Options
		want error
		msg  string
	}{
		{Options{ReaderArgs: ReaderArgs{BatchSize: 0}}, ErrOptions, "batch_size 0"},
		{Options{ReaderArgs: ReaderArgs{BatchSize: 2, ShardID: 3, NumShards: 2}}, ErrOptions, "shard_id 3"},
		{Options{ReaderArgs: ReaderArgs{BatchSize: 2}, Backend: "nvme-of"}, ErrOptions, `unknown backend "nvme-of"`},
		{Options{ReaderArgs: ReaderArgs{BatchSize: 2}, Memory: "hbm"}, ErrOptions, `memory kind "hbm"`},
		{Options{ReaderArgs: ReaderArgs{BatchSize: 2}, PrefetchQueueDepth: 3, Slots: 3}, ErrOptions, "slots"},
	}
	if _, err := os.Stat("/proc/driver/nvidia/version"); err != nil {
		tests = append(tests, struct {
			o    Options
			want error
			msg  string
		}{Options{ReaderArgs: ReaderArgs{BatchSize: 2}, Memory: batchmem.GPU}, ErrNoCUDA, "no CUDA driver found"})
	}
	for _, tt := range tests {
		_, err := New(context.Background(), m, tt.o)
		if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%+v: err = %v, want %v mentioning %q", tt.o, err, tt.want, tt.msg)
		}
	}
}

func TestSlotBytes(t *testing.T) {
	m := &bmap.Map{Samples: []bmap.Sample{{Size: 1}, {Size: 5000}, {Size: 4096}, {Size: 0}, {Size: 9000}}}
	for _, tt := range []struct {
		bs   int
		want int64
	}{{1, 12288}, {2, 12288 + 8192}, {3, 12288 + 8192 + 4096}, {10, 12288 + 8192 + 4096 + 4096}} {
		if got := SlotBytes(m, tt.bs); got != tt.want {
			t.Errorf("batch %d: %d, want %d", tt.bs, got, tt.want)
		}
	}
}

// TestSlotSizesKept: a SlotSizes gives SlotBytes, worked out at the
// first plan of a batch size and kept for the next (at most maxSlotSizes
// batch sizes), for one map at a time; plans made at once agree.
func TestSlotSizesKept(t *testing.T) {
	m := &bmap.Map{Samples: []bmap.Sample{{Size: 1}, {Size: 5000}, {Size: 4096}, {Size: 0}, {Size: 9000}}}
	other := &bmap.Map{Samples: []bmap.Sample{{Size: 70000}}}
	var s SlotSizes
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := 1; batch <= 2*maxSlotSizes; batch++ {
				if got, want := s.slotBytes(m, batch), SlotBytes(m, batch); got != want {
					t.Errorf("batch %d: %d, SlotBytes %d", batch, got, want)
				}
			}
		}()
	}
	wg.Wait()
	if len(s.by) != maxSlotSizes {
		t.Errorf("%d batch sizes kept, at most %d", len(s.by), maxSlotSizes)
	}
	if got, want := s.slotBytes(other, 3), SlotBytes(other, 3); got != want || len(s.by) != 1 {
		t.Errorf("another map: %d (%d kept), want SlotBytes %d, the first map's let go", got, len(s.by), want)
	}
	var none *SlotSizes
	if got, want := none.slotBytes(m, 2), SlotBytes(m, 2); got != want {
		t.Errorf("nil SlotSizes: %d, want %d", got, want)
	}
	// A plan given it takes its slot size from it.
	o := Options{ReaderArgs: ReaderArgs{BatchSize: 2}, SlotSizes: &s}
	p, err := NewPlan(m, o)
	if err != nil {
		t.Fatal(err)
	}
	if want := SlotBytes(m, 2); p.SlotSize != want || s.by[2] != want {
		t.Errorf("plan slot size %d (kept %d), want %d", p.SlotSize, s.by[2], want)
	}
}

// BenchmarkPlan: laying out a batch of 64 (the producer's per-batch
// work before the reads): in host memory (ragged), and in GPU memory (the
// double) for samples of mixed sizes (ragged) and of one size (dense).
func BenchmarkPlan(b *testing.B) {
	for _, bb := range []struct {
		name   string
		m      *bmap.Map
		memory batchmem.Kind
	}{
		{"host", makeDataset(b, 256, 4, 1000), batchmem.Pinned},
		{"gpu ragged", makeDataset(b, 256, 4, 1000), batchmem.GPU},
		{"gpu dense", uniformDataset(b, 256, 4, 1000), batchmem.GPU},
	} {
		b.Run(bb.name, func(b *testing.B) {
			var mem *gpuMemory
			o := Options{ReaderArgs: ReaderArgs{BatchSize: 64}, Memory: bb.memory}
			if bb.memory == batchmem.GPU {
				o.GPUPath, o.Backend, o.openMemory = GPUPathBounce, "file", gpuDouble(&mem)
			}
			l, err := New(context.Background(), bb.m, o)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			idx := make([]int32, 64)
			for i := range idx {
				idx[i] = int32(i * 3)
			}
			r := l.mem.Slot(0)
			batch := &Batch{Slot: 0, l: l, reqs: make([]backend.Request, 0, 64), mem: r.Host, dev: r.Dev}
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				l.plan(batch, 0, i, idx)
			}
			if want := bb.name == "gpu dense"; (batch.Dense() > 0) != want {
				b.Fatalf("Dense() = %d", batch.Dense())
			}
		})
	}
}

// inject installs f as the process's faults until t ends (package
// faults: the built-in backends' reads consult it) and returns it.
func inject(t *testing.T, f *faults.Faults) *faults.Faults {
	t.Cleanup(faults.Install(f))
	return f
}

// TestInjectedFaults drives the error paths through the fault seam, no
// root needed: EIO and short reads name their sample; the rest of the
// batch is intact; a stalled read does not hold up Close.
func TestInjectedFaults(t *testing.T) {
	m := makeDataset(t, 24, 3, 5000)
	eio, short := m.Samples[4].Path, m.Samples[10].Path
	inject(t, (&faults.Faults{}).
		Add(faults.Rule{Op: faults.FileRead, Path: eio, Err: unix.EIO}).
		Add(faults.Rule{Op: faults.FileRead, Path: short, Short: true}))
	for _, skip := range []bool{false, true} {
		l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 8}, SkipErrors: skip})
		if err != nil {
			t.Fatal(err)
		}
		var sampleErrs []error
		errs := eachBatch(l, func(b *Batch) {
			sampleErrs = append(sampleErrs, b.Errors...)
			for i := 0; i < b.Len(); i++ {
				if p := m.Samples[b.Indices[i]].Path; p == eio || p == short {
					if b.Lengths[i] != 0 {
						t.Errorf("failed sample %s delivered with %d bytes", p, b.Lengths[i])
					}
					continue
				}
				want, _ := os.ReadFile(filepath.Join(m.Root, m.Samples[b.Indices[i]].Path))
				if !bytes.Equal(b.Sample(i), want) {
					t.Errorf("sample %d: bytes differ", b.Indices[i])
				}
			}
		})
		errs = append(errs, sampleErrs...)
		l.Close()
		if len(errs) != 2 || !errors.Is(errs[0], unix.EIO) || !strings.Contains(errs[0].Error(), eio) ||
			!errors.Is(errs[1], backend.ErrShortRead) || !strings.Contains(errs[1].Error(), short) {
			t.Errorf("skip=%v: errors %v, want EIO naming %s and a short read naming %s", skip, errs, eio, short)
		}
	}
	// A read stalled for 2 s: Close still returns once it completes, and a
	// Next waiting on it ends with its context.
	inject(t, (&faults.Faults{}).Add(faults.Rule{Op: faults.FileRead, Path: m.Samples[0].Path, Stall: 2 * time.Second}))
	l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 8}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := l.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Next on a stalled batch: %v, want the deadline", err)
	}
	start := time.Now()
	if err := l.Close(); err != nil || time.Since(start) > 5*time.Second {
		t.Errorf("Close: %v after %s", err, time.Since(start))
	}
}

// TestNextAt serves batches by (epoch, iteration) as DALI's BatchInfo names
// them: in order at no extra cost, after a jump back or ahead exactly the
// batch asked for, io.EOF past an epoch's end, and Next goes on from there.
func TestNextAt(t *testing.T) {
	m := makeDataset(t, 50, 3, 2000)
	o := Options{ReaderArgs: ReaderArgs{BatchSize: 8, RandomShuffle: true, Seed: 4, NumShards: 2, ShardID: 1}, PrefetchQueueDepth: 2}
	ref, err := New(context.Background(), m, o)
	if err != nil {
		t.Fatal(err)
	}
	want := map[[2]int]string{}
	for e := 0; e < 3; e++ {
		eachBatch(ref, func(b *Batch) { want[[2]int{b.Epoch, b.Iteration}] = fmt.Sprint(b.Indices) })
	}
	ref.Close()
	nb := ref.Sampling().EpochBatches(0) // 25 samples / 8: 4 batches
	l, err := New(context.Background(), m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	steps := [][2]int{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}, {1, 0}, {1, 1}, {0, 2}, {0, 3}, {2, 3}, {2, 4}, {1, 0}, {0, 3}, {0, 9}}
	for _, st := range steps {
		b, err := l.NextAt(context.Background(), st[0], st[1])
		if st[1] >= nb {
			if err != io.EOF {
				t.Fatalf("NextAt%v: %v, want io.EOF", st, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("NextAt%v: %v", st, err)
		}
		if got := fmt.Sprint(b.Indices); b.Epoch != st[0] || b.Iteration != st[1] || got != want[st] {
			t.Fatalf("NextAt%v: epoch %d batch %d %s, want %s", st, b.Epoch, b.Iteration, got, want[st])
		}
		checkBatch(t, m, b)
		b.Release()
	}
	// After the EOF of epoch 0, Next goes on with epoch 1 batch 0.
	b, err := l.Next(context.Background())
	if err != nil || b.Epoch != 1 || b.Iteration != 0 || fmt.Sprint(b.Indices) != want[[2]int{1, 0}] {
		t.Fatalf("Next after NextAt's EOF: %v %v", b, err)
	}
	if st := l.State(); st.Epoch != 1 || st.Batch != 1 {
		t.Errorf("state %+v, want epoch 1 batch 1", st)
	}
	// Jumps while the consumer holds batches keep them intact.
	held := b
	heldBytes := append([]byte(nil), held.Sample(0)...)
	for i := 0; i < 5; i++ {
		b, err := l.NextAt(context.Background(), 2, i%nb)
		if err != nil {
			t.Fatal(err)
		}
		b.Release()
	}
	if !bytes.Equal(held.Sample(0), heldBytes) {
		t.Error("a held batch was overwritten by a seek")
	}
	held.Release()
}

// TestReadsOverlapBatchBoundaries: the reads of batch n+1 start before
// batch n's have completed (one stalled sample holds up only its batch).
func TestReadsOverlapBatchBoundaries(t *testing.T) {
	m := makeDataset(t, 64, 2, 3000)
	inject(t, (&faults.Faults{}).Add(faults.Rule{Op: faults.FileRead, Path: m.Samples[1].Path, Stall: 300 * time.Millisecond}))
	l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 8}, PrefetchQueueDepth: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var bs []*Batch
	for i := 0; i < 3; i++ {
		b, err := l.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	if bs[0].ReadTime() < 300*time.Millisecond {
		t.Fatalf("batch 0 took %s: the stall did not happen", bs[0].ReadTime())
	}
	for _, b := range bs[1:] {
		if !b.readStart.Before(bs[0].readEnd) || !b.readEnd.Before(bs[0].readEnd) {
			t.Errorf("batch %d read from %s to %s, batch 0 until %s: no overlap", b.Iteration,
				b.readStart.Sub(bs[0].readStart), b.readEnd.Sub(bs[0].readStart), bs[0].readEnd.Sub(bs[0].readStart))
		}
	}
	for _, b := range bs {
		b.Release()
	}
}
