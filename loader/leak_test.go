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
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
	"github.com/nvfeed/nvfeed/extentinfo"
	"github.com/nvfeed/nvfeed/internal/faults"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/internal/raw"
)

// secretMark is the recognisable content of root-only files the tests
// place next to (or onto the freed blocks of) samples: no byte of it may
// ever reach batch memory.
var secretMark = []byte("ROOT-SECRET!")

// secretData returns n bytes of secretMark repeated.
func secretData(n int) []byte {
	return bytes.Repeat(secretMark, n/len(secretMark)+1)[:n]
}

// writePrivate writes a 0600 file at fs-relative rel and syncs the
// filesystem, so that its blocks are allocated now.
func writePrivate(t *testing.T, fs *testfs.FS, rel string, data []byte) {
	t.Helper()
	p := fs.Path(rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	fs.Sync(t)
}

// extentsOf returns the FIEMAP extents of fs-relative rel.
func extentsOf(t *testing.T, fs *testfs.FS, rel string) []extentinfo.Extent {
	t.Helper()
	f, err := os.Open(fs.Path(rel))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var mp extentinfo.Mapper
	exts, err := mp.Extents(f)
	if err != nil {
		t.Fatal(err)
	}
	return exts
}

// overlaps reports whether device range [lo, hi) meets one of exts.
func overlaps(lo, hi uint64, exts []extentinfo.Extent) bool {
	for _, e := range exts {
		if e.Physical < hi && lo < e.Physical+e.Length {
			return true
		}
	}
	return false
}

// scanSlot fails the test if b's whole slot holds any of secretMark.
func scanSlot(t *testing.T, what string, b *Batch) {
	t.Helper()
	if i := bytes.Index(b.mem, secretMark); i >= 0 {
		t.Fatalf("%s: slot %d holds the root-only file's bytes at offset %d (batch %d of epoch %d)", what, b.Slot, i, b.Iteration, b.Epoch)
	}
}

// checkRooms checks each sample of b against its file and that every byte
// of its room past its size is zero; a failed sample's whole room must be
// zero.
func checkRooms(t *testing.T, what string, m *bmap.Map, b *Batch) {
	t.Helper()
	failed := map[int]bool{}
	for _, i := range b.Failed {
		failed[i] = true
	}
	for i := 0; i < b.Len(); i++ {
		s := &m.Samples[b.Indices[i]]
		off := b.Offsets[i] - b.base
		room := b.mem[off : off+backend.AlignUp(s.Size)]
		from := s.Size
		if failed[i] {
			from = 0
		} else {
			want, err := os.ReadFile(filepath.Join(m.Root, s.Path))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b.Sample(i), want) {
				t.Fatalf("%s: sample %s differs from its file", what, s.Path)
			}
		}
		for j := from; j < int64(len(room)); j++ {
			if room[j] != 0 {
				t.Fatalf("%s: sample %s (%d bytes, failed %v): byte %d of its %d-byte room is %#x, want 0 (%q...)",
					what, s.Path, s.Size, failed[i], j, len(room), room[j], room[j:min(j+16, int64(len(room)))])
			}
		}
	}
}

// TestRawSlackHoldsNoOtherFile reads samples whose ends fall inside a
// 4 KiB device block from a 1 KiB-block ext4, each followed on the device
// by a root-only file: the aligned reads of gds and bam must not bring the
// other file's blocks into the samples' slack, and the slack must be
// zeros.
func TestRawSlackHoldsNoOtherFile(t *testing.T) {
	fs := testfs.New(t, testfs.Options{Type: "ext4", SizeMB: 64, MkfsArgs: []string{"-b", "1024"}})
	rng := rand.New(rand.NewPCG(11, 12))
	sizes := []int{1000, 1500, 3000, 5000, 2048, 3072, 7000, 1}
	var names []string
	// Each sample is allocated, then a root-only file right after it (small
	// files share the allocator's per-CPU pool: they come out interleaved).
	for k := 0; k < 40; k++ {
		name := fmt.Sprintf("train/c%d/s%02d.jpg", k%2, k)
		data := make([]byte, sizes[k%len(sizes)])
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		fs.WriteFile(t, name, data)
		fs.Sync(t)
		writePrivate(t, fs, fmt.Sprintf("private/s%02d", k), secretData(3000))
		names = append(names, name)
	}
	m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The layout must expose the leak: some sample whose 4 KiB-aligned tail
	// read (device offset congruent with its memory) runs into a private
	// file's blocks.
	var private []extentinfo.Extent
	for k := range names {
		private = append(private, extentsOf(t, fs, fmt.Sprintf("private/s%02d", k))...)
	}
	exposed := 0
	for _, s := range m.Samples {
		segs := s.Segments(nil)
		if len(segs) == 0 || segs[len(segs)-1].Zero {
			continue
		}
		g := segs[len(segs)-1]
		end := g.DevOff + g.Len
		if (g.DevOff-g.FileOff)%backend.Align == 0 && overlaps(end, (end+backend.Align-1)&^(backend.Align-1), private) {
			exposed++
		}
	}
	if exposed == 0 {
		t.Fatalf("layout: no sample's aligned tail read reaches a private file's blocks; the test shows nothing")
	}
	t.Logf("%d of %d samples end next to a private file's blocks", exposed, len(m.Samples))
	// Through the backends alone (nothing zeroes after them): no read may
	// write a sample's room past the end of the file's last block.
	for _, tc := range []struct {
		backend string
		opts    map[string]any
	}{
		{"gds", nil},
		{"bam", map[string]any{"cache_mb": 0}},
	} {
		spec, err := BackendSpec(tc.backend)
		if err != nil {
			t.Fatal(err)
		}
		p, err := spec.Resolve(tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		be, err := spec.Open(m, p, backend.Env{})
		if err != nil {
			t.Fatal(err)
		}
		reqs := make([]backend.Request, len(m.Samples))
		rooms := rawRooms(t, len(m.Samples), 8192)
		for i := range m.Samples {
			reqs[i] = backend.Request{Index: i, Sample: &m.Samples[i], Buf: rooms[i][:backend.AlignUp(m.Samples[i].Size)]}
		}
		err = be.ReadBatch(context.Background(), reqs)
		be.Close()
		if err != nil {
			t.Fatalf("%s: %v", tc.backend, err)
		}
		for _, r := range reqs {
			own := (r.Sample.Size + 1023) &^ 1023 // the end of its last 1 KiB block
			for j := own; j < int64(len(r.Buf)); j++ {
				if r.Buf[j] != 0xAA {
					t.Fatalf("%s: sample %s (%d bytes): byte %d of its room, past its last block, was written (%q...)", tc.backend, r.Sample.Path, r.Sample.Size, j, r.Buf[j:min(j+16, int64(len(r.Buf)))])
				}
			}
		}
	}
	for _, tc := range []struct {
		backend string
		opts    map[string]any
	}{
		{"gds", map[string]any{"engine": raw.EngineUring}},
		{"gds", map[string]any{"engine": raw.EnginePread}},
		{"bam", map[string]any{"cache_mb": 0}},
		{"bam", map[string]any{"cache_mb": 1}},
		{"bam", map[string]any{"cache_mb": 1, "block_size": 8192}},
	} {
		what := fmt.Sprintf("%s %v", tc.backend, tc.opts)
		t.Run(what, func(t *testing.T) {
			l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 6, RandomShuffle: true, Seed: 3}, Backend: tc.backend, PrefetchQueueDepth: 2, BackendOptions: tc.opts})
			if err != nil {
				if strings.Contains(err.Error(), "io_uring") {
					testenv.SkipPrivileged(t, "io_uring refused: %v", err)
				}
				t.Fatal(err)
			}
			defer l.Close()
			for e := 0; e < 2; e++ { // the second epoch: bam's cache serves blocks
				if errs := eachBatch(l, func(b *Batch) {
					checkRooms(t, what, m, b)
					scanSlot(t, what, b)
				}); len(errs) > 0 {
					t.Fatalf("%s: %v", what, errs)
				}
			}
			if st := l.Backend().Stats(); st.Counter("raw_samples") == 0 || st.Counter("errors") != 0 {
				t.Errorf("%s: stats %+v", what, st)
			}
		})
	}
}

// fillFS takes every free block of fs's filesystem with unwritten extents
// of one file, so that the next allocation can only reuse blocks freed
// after it.
func fillFS(t *testing.T, fs *testfs.FS) {
	t.Helper()
	f, err := os.OpenFile(fs.Path("fill.dat"), os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var off int64
	for chunk := int64(64 << 20); chunk >= 4096; {
		if err := unix.Fallocate(int(f.Fd()), 0, off, chunk); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("fallocate: %v", err)
			}
			chunk /= 2
			continue
		}
		off += chunk
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	fs.Sync(t)
}

// TestRawReusedBlocksNeverInBatch deletes a sample while a loader is open
// and lets a root-only file take its blocks (a full filesystem leaves it
// no others) before the sample's batch is read: the sample fails, its room
// is zeros, and the root-only file's bytes are nowhere in batch memory.
// The third case changes the file while its raw read is under way (a
// stalled device read), so that only the check after the read can find
// it: its room must be zeros too. The last reads a sample whose class had
// already changed, through the backend alone (nothing zeroes after it): a
// change during the read must leave its room in the slot untouched.
func TestRawReusedBlocksNeverInBatch(t *testing.T) {
	for _, tc := range []struct {
		name     string
		policy   string
		duringIO bool // the file changes while its read stalls
		guarded  bool // its class changed before: the backend alone reads it guarded
	}{
		{"before the read, fallback", raw.StaleFallback, false, false},
		{"before the read, fail", raw.StaleFail, false, false},
		{"during the read", raw.StaleFail, true, false},
		{"during the guarded read", raw.StaleFail, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := testfs.New(t, testfs.Options{Type: "ext4", SizeMB: 16, MkfsArgs: []string{"-b", "4096", "-m", "0"}})
			// No clusters kept back for the filesystem's own use: a full
			// filesystem has no free block at all.
			if err := os.WriteFile(filepath.Join("/sys/fs/ext4", filepath.Base(fs.Dev), "reserved_clusters"), []byte("0"), 0); err != nil {
				t.Fatalf("ext4 reserved_clusters: %v", err)
			}
			const victimSize = 64<<10 + 100
			for i := 0; i < 3; i++ {
				fs.WriteFile(t, fmt.Sprintf("train/a/a%d.jpg", i), bytes.Repeat([]byte{byte('a' + i)}, 5000+i*1000))
			}
			fs.WriteFile(t, "train/a/victim.jpg", bytes.Repeat([]byte("VICTIM-DATA-"), victimSize/12+1)[:victimSize])
			fs.Sync(t)
			m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
			if err != nil {
				t.Fatal(err)
			}
			victim := 3
			if m.Samples[victim].Path != "a/victim.jpg" || m.Samples[victim].Reason != bmap.Raw {
				t.Fatalf("sample 3 is %+v, want the raw victim", m.Samples[victim])
			}
			old := m.Samples[victim].Extents
			fillFS(t, fs)
			var stall *faults.Faults
			if tc.duringIO {
				stall = inject(t, (&faults.Faults{}).Add(faults.Rule{Op: faults.DeviceRead, Path: "a/victim.jpg", Stall: 2 * time.Second, Times: 1}))
			}
			g, err := fresh.Open(m, fresh.Watch, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			reuse := func() {
				if err := os.Remove(fs.Path("train/a/victim.jpg")); err != nil {
					t.Error(err)
					return
				}
				// Blocks freed in a transaction are reused only after it
				// commits.
				if out, err := testfs.Command("sync", "-f", fs.Dir); err != nil {
					t.Errorf("sync: %v: %s", err, out)
				}
				p := fs.Path("private.dat")
				if err := os.WriteFile(p, secretData(victimSize), 0o600); err != nil {
					t.Errorf("the root-only file: %v", err)
					return
				}
				if out, err := testfs.Command("sync", "-f", fs.Dir); err != nil {
					t.Errorf("sync: %v: %s", err, out)
				}
				f, err := os.Open(p)
				if err != nil {
					t.Error(err)
					return
				}
				var mp extentinfo.Mapper
				sec, err := mp.Extents(f)
				f.Close()
				if err != nil {
					t.Error(err)
					return
				}
				for _, e := range old {
					if !overlaps(e.Physical, e.Physical+e.Length, sec) {
						t.Errorf("the root-only file did not take the victim's blocks: victim %v, file %v", old, sec)
						return
					}
				}
			}
			if tc.guarded {
				readGuarded(t, m, g, stall, victim, reuse)
				return
			}
			// Batch size 1, no shuffle, depth 1: batches 0 and 1 are read at
			// once, the victim's (3) only after two releases.
			l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 1}, Backend: "gds", PrefetchQueueDepth: 1, SkipErrors: true, Guard: g,
				BackendOptions: map[string]any{"on_stale": tc.policy}})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			reused := make(chan struct{})
			if tc.duringIO { // change the file while the victim's read stalls
				go func() {
					defer close(reused)
					for stall.Hits() == 0 {
						time.Sleep(5 * time.Millisecond)
					}
					reuse()
				}()
			} else {
				reuse()
				close(reused)
			}
			defer func() { <-reused }()
			for want := 0; want < 4; want++ {
				b, err := l.Next(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				scanSlot(t, tc.name, b)
				checkRooms(t, tc.name, m, b)
				if b.Iteration == victim {
					if len(b.Failed) != 1 || b.Failed[0] != 0 || b.Lengths[0] != 0 {
						t.Errorf("victim's batch: failed %v errors %v lengths %v, want the victim failed", b.Failed, b.Errors, b.Lengths)
					}
				}
				b.Release()
			}
			if t.Failed() {
				return
			}
			if _, err := l.Next(context.Background()); err != io.EOF {
				t.Errorf("after the epoch: %v, want io.EOF", err)
			}
			if st := l.Backend().Stats(); st.Counter("stale_samples") != 1 {
				t.Errorf("stale samples %d, want 1 (the victim): %+v", st.Counter("stale_samples"), st)
			}
		})
	}
}

// rawRooms returns n rooms of size bytes each, 4 KiB-aligned, outside the
// Go heap, filled with 0xAA.
func rawRooms(t *testing.T, n int, size int64) [][]byte {
	t.Helper()
	room := backend.AlignUp(size)
	mem, err := unix.Mmap(-1, 0, int(max(room, backend.Align))*n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	for i := range mem {
		mem[i] = 0xAA
	}
	var rooms [][]byte
	for i := 0; i < n; i++ {
		rooms = append(rooms, mem[int64(i)*room:int64(i+1)*room:int64(i+1)*room])
	}
	return rooms
}

// readGuarded opens gds over m with guard g and reads sample victim
// straight through the backend, after a file appears in its class (so
// that it is read guarded) and with change run while its device read
// stalls (faults): the read must fail and its room stay untouched.
func readGuarded(t *testing.T, m *bmap.Map, g *fresh.Guard, stall *faults.Faults, victim int, change func()) {
	spec, _ := BackendSpec("gds")
	p, err := spec.Resolve(map[string]any{"on_stale": raw.StaleFail})
	if err != nil {
		t.Fatal(err)
	}
	be, err := spec.Open(m, p, backend.Env{Guard: g})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if err := os.WriteFile(filepath.Join(m.Root, "a", "new.jpg"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s := &m.Samples[victim]
	reqs := []backend.Request{{Index: victim, Sample: s, Buf: rawRooms(t, 1, s.Size)[0]}}
	done := make(chan error, 1)
	go func() { done <- be.ReadBatch(context.Background(), reqs) }()
	for stall.Hits() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	change()
	if err := <-done; !errors.Is(err, bmap.ErrStale) || !errors.Is(reqs[0].Err, bmap.ErrStale) {
		t.Fatalf("ReadBatch: %v (sample: %v), want the victim stale", err, reqs[0].Err)
	}
	for i, c := range reqs[0].Buf {
		if c != 0xAA {
			t.Fatalf("the stale sample's room in the slot was written: byte %d is %#x (%q...)", i, c, reqs[0].Buf[i:min(i+16, len(reqs[0].Buf))])
		}
	}
}
