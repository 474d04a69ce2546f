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
	"github.com/nvfeed/nvfeed/loader/internal/fsread"
	"github.com/nvfeed/nvfeed/loader/internal/raw"
)

// rawDataset makes the awkward files plus 150 ordinary ones on fs and maps
// them.
func rawDataset(t *testing.T, fs *testfs.FS) *bmap.Map {
	testfs.Populate(t, fs, "train", 3)
	rng := rand.New(rand.NewPCG(4, 4))
	return randomFiles(t, fs, rng, 150, func(int) int { return int(rng.ExpFloat64() * 30_000) })
}

// randomFiles writes n files of random bytes, file i of size(i) bytes,
// in 4 class folders under train/ on fs, and maps train/.
func randomFiles(t *testing.T, fs *testfs.FS, rng *rand.Rand, n int, size func(i int) int) *bmap.Map {
	for i := 0; i < n; i++ {
		b := make([]byte, size(i))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		fs.WriteFile(t, fmt.Sprintf("train/c%d/%03d.jpg", i%4, i), b)
	}
	fs.Sync(t)
	m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

var rawFilesystems = []testfs.Options{
	testfs.Ext4(),
	{Type: "ext4", MkfsArgs: []string{"-b", "1024", "-O", "inline_data"}}, // 1 KiB blocks: unaligned extents, bounce buffers
	testfs.XFS(),
}

func TestRawBackendsByteExact(t *testing.T) {
	for _, fo := range rawFilesystems {
		t.Run(fmt.Sprintf("%s%v", fo.Type, fo.MkfsArgs), func(t *testing.T) {
			fs := testfs.New(t, fo)
			m := rawDataset(t, fs)
			st := m.Stats()
			if st.FSOnly == len(m.Samples) || st.MultiExtent == 0 {
				t.Fatalf("dataset lacks raw or fragmented samples: %s", st)
			}
			for _, backend := range []string{"gds", "bam"} {
				for _, engine := range []string{raw.EngineUring, raw.EnginePread} {
					t.Run(backend+"/"+engine, func(t *testing.T) {
						for shard := 0; shard < 2; shard++ {
							l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 7, NumShards: 2, ShardID: shard, RandomShuffle: true, Seed: 9}, Backend: backend, PrefetchQueueDepth: 3, BackendOptions: map[string]any{"engine": engine, "queue_depth": 8}})
							if err != nil {
								if strings.Contains(err.Error(), "io_uring") {
									testenv.SkipPrivileged(t, "io_uring refused: %v", err)
								}
								t.Fatal(err)
							}
							for e := 0; e < 3; e++ {
								collectEpoch(t, l, m, true)
							}
							st := l.Backend().Stats()
							l.Close()
							if st.Engine != engine || st.Counter("raw_samples") == 0 || st.Counter("stale_samples") != 0 || st.Counter("errors") != 0 {
								t.Errorf("stats %+v", st)
							}
							if backend == "bam" && st.Counter("cache_hits") == 0 {
								t.Errorf("bam: no cache hits over 3 epochs of a dataset that fits: %+v", st)
							}
							if fo.Type == "ext4" && st.Counter("fs_only_samples") == 0 {
								t.Errorf("ext4: inline samples not read through the filesystem: %+v", st)
							}
						}
					})
				}
			}
		})
	}
}

func TestReplacedFileNeverReadFromOldBlocks(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	big := bytes.Repeat([]byte("OLD-CONTENT-"), 200_000)
	fs.WriteFile(t, "train/a/victim.jpg", big)
	fs.WriteFile(t, "train/a/other.jpg", []byte("unchanged"))
	fs.Sync(t)
	m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old := m.Samples[1].Extents
	// Delete the victim; a secret file takes its blocks; a new file with
	// the same name and size appears elsewhere.
	os.Remove(fs.Path("train/a/victim.jpg"))
	fs.Sync(t)
	secret := bytes.Repeat([]byte("SECRET-DATA!"), 200_000)
	fs.WriteFile(t, "secret.dat", secret)
	fs.WriteFile(t, "train/a/victim.jpg", bytes.Repeat([]byte("NEW-CONTENT-"), 200_000))
	fs.Sync(t)
	f, _ := os.Open(fs.Path("secret.dat"))
	var mp extentinfo.Mapper
	sec, _ := mp.Extents(f)
	f.Close()
	if len(sec) == 0 || sec[0].Physical != old[0].Physical {
		t.Logf("note: the secret file did not reuse the victim's first block (%v vs %v)", sec, old)
	}
	for _, policy := range []string{raw.StaleFallback, raw.StaleFail} {
		for _, backend := range []string{"gds", "bam"} {
			l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 2}, Backend: backend, SkipErrors: true, BackendOptions: map[string]any{"on_stale": policy}})
			if err != nil {
				t.Fatal(err)
			}
			b, err := l.Next(context.Background())
			if err != nil {
				t.Fatalf("%s/%s: %v", backend, policy, err)
			}
			for i := 0; i < b.Len(); i++ {
				if bytes.Contains(b.Sample(i), []byte("SECRET")) || bytes.Contains(b.Sample(i), []byte("OLD-CONTENT")) || bytes.Contains(b.Sample(i), []byte("NEW-CONTENT")) {
					t.Fatalf("%s/%s: sample %d served from the old blocks or from the file that replaced it", backend, policy, b.Indices[i])
				}
			}
			// The path now names another file: with either policy a failed
			// sample (read through the filesystem, the new file is refused
			// as not the one mapped).
			want := bmap.ErrStale
			if policy == raw.StaleFallback {
				want = fsread.ErrReplaced
				if n := l.Backend().Stats().Counter("stale_samples"); n < 1 {
					t.Errorf("%s: stale_samples = %d, want the replaced file counted", backend, n)
				}
			}
			if len(b.Errors) != 1 || !errors.Is(b.Errors[0], want) || !strings.Contains(b.Errors[0].Error(), "victim.jpg") || b.Lengths[1] != 0 {
				t.Errorf("%s/%s: errors %v lengths %v, want one error wrapping %v naming victim.jpg", backend, policy, b.Errors, b.Lengths, want)
			}
			if !bytes.Equal(b.Sample(0), []byte("unchanged")) {
				t.Errorf("%s/%s: the other sample of the batch was affected", backend, policy)
			}
			b.Release()
			l.Close()
		}
	}
}

func TestShrunkDeviceGivesNamedError(t *testing.T) {
	for _, engine := range []string{raw.EngineUring, raw.EnginePread} {
		t.Run(engine, func(t *testing.T) {
			fs := testfs.New(t, testfs.Options{Type: "ext4", SizeMB: 256, MkfsArgs: []string{"-b", "4096"}})
			fs.WriteFile(t, "train/a/low.jpg", []byte("small and early"))
			fs.Sync(t)
			// Fill so that a later file lands far into the device.
			fs.WriteFile(t, "pad.dat", make([]byte, 120<<20))
			fs.Sync(t)
			far := bytes.Repeat([]byte{7}, 1<<20)
			fs.WriteFile(t, "train/a/zfar.jpg", far)
			fs.Sync(t)
			m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
			if err != nil {
				t.Fatal(err)
			}
			// The victim is whichever sample lies further into the device.
			keep, victim := 0, 1
			if m.Samples[0].Extents[0].Physical > m.Samples[1].Extents[0].Physical {
				keep, victim = 1, 0
			}
			keepExt, farExt := m.Samples[keep].Extents[0], m.Samples[victim].Extents[0]
			if keepExt.Physical+keepExt.Length > farExt.Physical {
				t.Fatalf("layout: samples overlap on the device: %v %v", keepExt, farExt)
			}
			keepData, _ := os.ReadFile(fs.Path("train", m.Samples[keep].Path))
			victimName := m.Samples[victim].Path
			l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 2}, Backend: "gds", SkipErrors: true, BackendOptions: map[string]any{"engine": engine}})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			// Shrink the device under the open loader: cut the image below
			// the far file and tell the loop driver.
			if err := os.Truncate(fs.Image, int64(farExt.Physical)); err != nil {
				t.Fatal(err)
			}
			if out, err := testfs.Command("losetup", "-c", fs.Dev); err != nil {
				t.Fatalf("losetup -c: %v: %s", err, out)
			}
			// Batches prefetched before the cut are fine; the first one read
			// after it must name the victim and keep the other sample.
			var b *Batch
			for i := 0; i < 12 && b == nil; i++ {
				nb, err := l.Next(context.Background())
				if err == io.EOF {
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if len(nb.Errors) == 0 {
					nb.Release()
					continue
				}
				b = nb
			}
			if b == nil {
				t.Fatal("no batch read after the device shrank reported an error")
			}
			if len(b.Errors) != 1 || !strings.Contains(b.Errors[0].Error(), victimName) || !strings.Contains(b.Errors[0].Error(), fs.Dev) {
				t.Fatalf("errors %v, want one naming %s and %s", b.Errors, victimName, fs.Dev)
			}
			if !bytes.Equal(b.Sample(keep), keepData) || b.Lengths[victim] != 0 {
				t.Errorf("the readable sample was affected: %d bytes, victim length %d", len(b.Sample(keep)), b.Lengths[victim])
			}
			b.Release()
			// A loader opened now refuses the range before reading it.
			l2, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 2}, Backend: "gds", BackendOptions: map[string]any{"engine": engine}})
			if err != nil {
				t.Fatal(err)
			}
			defer l2.Close()
			if _, err := l2.Next(context.Background()); err == nil || !strings.Contains(err.Error(), "past the end") || !strings.Contains(err.Error(), victimName) {
				t.Errorf("err = %v, want 'past the end' naming %s", err, victimName)
			}
			if _, err := l2.Next(context.Background()); err != io.EOF {
				t.Errorf("after the failed batch: %v, want io.EOF", err)
			}
		})
	}
}

// TestChangeAfterOpenDetected changes files while a loader runs: one is
// replaced (its blocks going to a secret file), one with a hard link
// outside the dataset is truncated and rewritten through that link. No
// batch may ever hold the secret; the rewritten file's new contents show
// up (read through the filesystem), and the replaced one is a failed
// sample: its path names another file than the one mapped, whose bytes
// are never served.
func TestChangeAfterOpenDetected(t *testing.T) {
	for _, fresh := range []string{raw.FreshWatch, raw.FreshRead} {
		t.Run(fresh, func(t *testing.T) {
			fs := testfs.New(t, testfs.Ext4())
			fs.WriteFile(t, "train/a/victim.jpg", bytes.Repeat([]byte("OLD-CONTENT-"), 100_000))
			fs.WriteFile(t, "train/b/linked.jpg", bytes.Repeat([]byte("OLD-LINKED--"), 100_000))
			if err := os.Link(fs.Path("train/b/linked.jpg"), fs.Path("outside.dat")); err != nil {
				t.Fatal(err)
			}
			fs.Sync(t)
			m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
			if err != nil {
				t.Fatal(err)
			}
			l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 2}, Backend: "gds", PrefetchQueueDepth: 1, SkipErrors: true, BackendOptions: map[string]any{"freshness": fresh}})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			collectEpoch(t, l, m, true)
			// Replace the victim atomically (its old blocks are freed) and
			// truncate the linked file through its outside name; a secret
			// file then takes the freed blocks. Reads in between may fail
			// (a file in the middle of a rewrite): that is an error, never
			// wrong bytes.
			fs.WriteFile(t, "train/a/.victim.tmp", bytes.Repeat([]byte("NEW-CONTENT-"), 100_000))
			os.Rename(fs.Path("train/a/.victim.tmp"), fs.Path("train/a/victim.jpg"))
			f, _ := os.OpenFile(fs.Path("outside.dat"), os.O_WRONLY|os.O_TRUNC, 0)
			f.Close()
			fs.Sync(t)
			fs.WriteFile(t, "secret.dat", bytes.Repeat([]byte("SECRET-DATA!"), 300_000))
			os.WriteFile(fs.Path("outside.dat"), bytes.Repeat([]byte("NEW-LINKED--"), 100_000), 0o644)
			fs.Sync(t)
			sawNew := 0
			for e := 0; e < 4; e++ {
				for {
					b, err := l.Next(context.Background())
					if err == io.EOF {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					for _, err := range b.Errors {
						if !errors.Is(err, backend.ErrShortRead) && !errors.Is(err, bmap.ErrStale) && !errors.Is(err, fsread.ErrReplaced) {
							t.Errorf("unexpected sample error: %v", err)
						}
					}
					for i := 0; i < b.Len(); i++ {
						d := b.Sample(i)
						if bytes.Contains(d, []byte("SECRET")) {
							t.Fatalf("epoch %d: sample %d served another file's blocks", b.Epoch, b.Indices[i])
						}
						if bytes.HasPrefix(d, []byte("NEW-CONTENT")) {
							t.Fatalf("epoch %d: sample %d served the file that replaced it", b.Epoch, b.Indices[i])
						}
						if bytes.HasPrefix(d, []byte("NEW-LINKED")) {
							sawNew++
						}
					}
					b.Release()
				}
			}
			if sawNew < 2 {
				t.Errorf("the rewritten file's new contents seen %d times over the later epochs, want at least 2", sawNew)
			}
			if n := l.Backend().Stats().Counter("stale_samples"); n < 2 {
				t.Errorf("stale_samples = %d, want both changes counted", n)
			}
		})
	}
}

// TestRawInjectedEIO fails the device reads of one raw sample in each
// backend and engine: the error names the sample and the device range,
// wraps EIO, and the other samples of the batch are intact.
func TestRawInjectedEIO(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	m := rawDataset(t, fs)
	victim := -1
	for i, s := range m.Samples {
		if s.Reason == bmap.Raw && s.Size > 8192 {
			victim = i
			break
		}
	}
	if victim < 0 {
		t.Fatal("no raw sample to fail")
	}
	path := m.Samples[victim].Path
	for _, be := range []string{"gds", "bam"} {
		for _, engine := range []string{raw.EngineUring, raw.EnginePread} {
			inject(t, (&faults.Faults{}).Add(faults.Rule{Op: faults.DeviceRead, Path: path, Err: unix.EIO}))
			l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 16}, Backend: be, SkipErrors: true, BackendOptions: map[string]any{"engine": engine}})
			if err != nil {
				t.Fatal(err)
			}
			var failed []error
			if errs := eachBatch(l, func(b *Batch) {
				failed = append(failed, b.Errors...)
				for i := 0; i < b.Len(); i++ {
					if int(b.Indices[i]) == victim {
						continue
					}
					want, _ := os.ReadFile(fs.Path("train", m.Samples[b.Indices[i]].Path))
					if !bytes.Equal(b.Sample(i), want) {
						t.Fatalf("%s/%s: sample %d differs from its file", be, engine, b.Indices[i])
					}
				}
			}); len(errs) > 0 {
				t.Fatal(errs)
			}
			st := l.Backend().Stats()
			l.Close()
			if len(failed) != 1 || !errors.Is(failed[0], unix.EIO) || !strings.Contains(failed[0].Error(), path) || !strings.Contains(failed[0].Error(), fs.Dev) {
				t.Errorf("%s/%s: errors %v, want one EIO naming %s and %s", be, engine, failed, path, fs.Dev)
			}
			if st.Counter("errors") < 1 { // prefetching may have read the next epoch's copy too
				t.Errorf("%s/%s: stats count %d errors, want the failure counted", be, engine, st.Counter("errors"))
			}
		}
	}
}

// TestSharedGuard runs two raw loaders over one freshness guard, as the
// daemon's sessions do: a file replaced after the guard's stat pass is
// caught through the shared watch by both (a failed sample: neither its
// old blocks nor the new file are served), and closing the loaders leaves
// the guard to its owner.
func TestSharedGuard(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	fs.WriteFile(t, "train/a/victim.jpg", bytes.Repeat([]byte("OLD-CONTENT-"), 100_000))
	fs.WriteFile(t, "train/b/other.jpg", bytes.Repeat([]byte("other"), 1000))
	fs.Sync(t)
	m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := fresh.Open(m, fresh.Watch, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var ls []*Loader
	for _, be := range []string{"gds", "bam"} {
		l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 2}, Backend: be, PrefetchQueueDepth: 1, SkipErrors: true, Guard: g})
		if err != nil {
			t.Fatal(err)
		}
		collectEpoch(t, l, m, true)
		ls = append(ls, l)
	}
	fs.WriteFile(t, "train/a/.tmp", bytes.Repeat([]byte("NEW-CONTENT-"), 100_000))
	os.Rename(fs.Path("train/a/.tmp"), fs.Path("train/a/victim.jpg"))
	fs.Sync(t)
	fs.WriteFile(t, "secret.dat", bytes.Repeat([]byte("SECRET-DATA!"), 300_000))
	fs.Sync(t)
	for _, l := range ls {
		replaced := 0
		for e := 0; e < 5; e++ { // batches prefetched before the change may hold the old contents: then still the file's
			eachBatch(l, func(b *Batch) {
				for i := 0; i < b.Len(); i++ {
					d := b.Sample(i)
					if bytes.Contains(d, []byte("SECRET")) || bytes.Contains(d, []byte("NEW-CONTENT")) {
						t.Fatalf("%s: sample %d served from blocks it no longer owns, or the file that replaced it", l.Backend().Name(), b.Indices[i])
					}
				}
				for _, err := range b.Errors {
					if errors.Is(err, fsread.ErrReplaced) {
						replaced++
					}
				}
			})
		}
		if replaced < 2 {
			t.Errorf("%s: the replaced file failed %d times in 5 epochs, want every epoch after the change", l.Backend().Name(), replaced)
		}
		if st := l.Backend().Stats(); st.Counter("stale_samples") == 0 {
			t.Errorf("%s: the replaced file was not counted stale: %+v", l.Backend().Name(), st)
		}
		l.Close()
	}
	if err := g.Check(1); err != nil { // the guard is still open: its root fd works
		t.Errorf("guard after the loaders closed: %v", err)
	}
}

// TestSharedEngines: loaders given one Shared read through one
// engine set per device and configuration; each stays byte-exact while the
// others read at once, and closing the one that started the engine leaves
// it working for the rest.
func TestSharedEngines(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	m := rawDataset(t, fs)
	var shared Shared
	open := func(be string, shard int) *Loader {
		l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 5, NumShards: 3, ShardID: shard, RandomShuffle: true, Seed: 3}, Backend: be, PrefetchQueueDepth: 2, Shared: &shared, BackendOptions: map[string]any{"queue_depth": 8}})
		if err != nil {
			if strings.Contains(err.Error(), "io_uring") {
				testenv.SkipPrivileged(t, "io_uring refused: %v", err)
			}
			t.Fatal(err)
		}
		return l
	}
	first := open("gds", 0)
	rest := []*Loader{open("gds", 1), open("gds", 2)}
	if n := shared.Len(); n != 1 {
		t.Fatalf("3 gds loaders on one device hold %d engines, want 1", n)
	}
	bam := open("bam", 0)
	if n := shared.Len(); n != 4 { // bam's first queue is the same engine configuration as gds's
		t.Fatalf("gds + bam (4 queues) hold %d engines, want 4", n)
	}
	bam.Close()
	collectEpoch(t, first, m, true)
	first.Close() // started the engine: the others keep it
	done := make(chan struct{})
	for _, l := range rest {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 2 {
				collectEpoch(t, l, m, true)
			}
		}()
	}
	for range rest {
		<-done
	}
	for _, l := range rest {
		if st := l.Backend().Stats(); st.Counter("raw_samples") == 0 || st.Counter("errors") != 0 {
			t.Errorf("stats %+v", st)
		}
		l.Close()
	}
	if n := shared.Len(); n != 0 {
		t.Errorf("%d engines left after every loader closed", n)
	}
}

// TestDevicesSplitTheQueue: loaders given one Devices count their own
// engines on one device queue, read byte-exact at once, and give the
// queue back when the last closes.
func TestDevicesSplitTheQueue(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	m := rawDataset(t, fs)
	var devices Devices
	var ls []*Loader
	for shard := range 2 {
		l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 5, NumShards: 2, ShardID: shard, RandomShuffle: true, Seed: 3}, Backend: "gds", PrefetchQueueDepth: 2, Devices: &devices})
		if err != nil {
			if strings.Contains(err.Error(), "io_uring") {
				testenv.SkipPrivileged(t, "io_uring refused: %v", err)
			}
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	if n := devices.Len(); n != 1 {
		t.Fatalf("2 gds loaders on one device share %d device queues, want 1", n)
	}
	done := make(chan struct{})
	for _, l := range ls {
		go func() {
			defer func() { done <- struct{}{} }()
			collectEpoch(t, l, m, true)
		}()
	}
	for range ls {
		<-done
	}
	for _, l := range ls {
		l.Close()
	}
	if n := devices.Len(); n != 0 {
		t.Errorf("%d device queues left after every loader closed", n)
	}
}

// TestDefaultBackendIsFastestAllowed: a loader that names no backend
// reads with the fastest the map and the process allow, and says why
// (Loader.BackendWhy): raw reads (gds) over a map of a block device, the
// filesystem over a map without one, over backend options given without
// a name (they are file's), and where gds does not open (here: the map
// names another filesystem UUID, so its freshness check refuses); a
// named backend is kept and says nothing.
func TestDefaultBackendIsFastestAllowed(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	m := rawDataset(t, fs)
	other := *m
	other.Device.FSUUID = "00000000-0000-0000-0000-000000000000"
	for _, tc := range []struct {
		name          string
		m             *bmap.Map
		o             Options
		want, wantWhy string
	}{
		{"raw map", m, Options{}, "gds", "auto: raw reads from " + m.Device.Path},
		{"filesystem-only map", makeDataset(t, 40, 3, 3000), Options{}, "file", "has no block device"},
		{"options without a name", m, Options{BackendOptions: map[string]any{"workers": 2}}, "file", "backend_options without a backend name"},
		{"gds does not open", &other, Options{}, "file", "auto: gds did not open here"},
		{"named", m, Options{Backend: "file"}, "file", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.ReaderArgs = ReaderArgs{BatchSize: 7}
			tc.o.PrefetchQueueDepth = 2
			l, err := New(context.Background(), tc.m, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			collectEpoch(t, l, tc.m, true)
			got, why := l.Backend().Name(), l.BackendWhy()
			if got != tc.want || !strings.Contains(why, tc.wantWhy) || (tc.wantWhy == "") != (why == "") {
				t.Errorf("backend %s (%q), want %s (%q)", got, why, tc.want, tc.wantWhy)
			}
		})
	}
}

// A gds session registers its batch memory with io_uring piece by piece,
// off the open: as the first read into each is issued. Open pins nothing
// it must wait for, reads into the lazily registered pieces are
// byte-exact, PinBuffers registers the rest, and close unpins them all.
func TestGDSPinsSlotsOffTheOpen(t *testing.T) {
	fs := testfs.New(t, testfs.Options{Type: "ext4", SizeMB: 256, MkfsArgs: []string{"-b", "4096"}})
	m := randomFiles(t, fs, rand.New(rand.NewPCG(7, 7)), 48, func(i int) int { return 1<<20 + i*512 })
	before := testenv.PinnedBytes(t)
	const slots = 12
	l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 4, RandomShuffle: true, Seed: 3},
		Backend: "gds", PrefetchQueueDepth: 1, Slots: slots, BackendOptions: map[string]any{"engine": raw.EngineUring, "queue_depth": 8}})
	if err != nil {
		if strings.Contains(err.Error(), "io_uring") {
			testenv.SkipPrivileged(t, "io_uring refused: %v", err)
		}
		t.Fatal(err)
	}
	defer l.Close()
	slot := l.Memory().Desc().SlotSize
	b, err := l.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	checkBatch(t, m, b)
	if pinned := testenv.PinnedBytes(t) - before; pinned <= 0 || pinned > slots*slot {
		t.Errorf("after the first batch %d KiB pinned, want (0, %d] (%d slots of %d KiB)", pinned>>10, slots*slot>>10, slots, slot>>10)
	}
	b.Release()
	got := len(b.Indices) + len(collectEpoch(t, l, m, true))
	if got != len(m.Samples) {
		t.Errorf("epoch: %d samples, want %d", got, len(m.Samples))
	}
	if st := l.Backend().Stats(); st.Counter("raw_samples") == 0 || st.Counter("errors") != 0 {
		t.Errorf("stats %+v", st)
	}
	if pinned := testenv.PinnedBytes(t) - before; pinned > slots*slot {
		t.Errorf("after an epoch %d KiB pinned, more than the %d slots of %d KiB", pinned>>10, slots, slot>>10)
	}
	// What loaderd bench asks before its clock: every slot registered.
	l.Backend().(interface{ PinBuffers() }).PinBuffers()
	if pinned := testenv.PinnedBytes(t) - before; pinned != slots*slot {
		t.Errorf("after PinBuffers %d KiB pinned, want the %d slots of %d KiB", pinned>>10, slots, slot>>10)
	}
	l.Close()
	// A ring's teardown, its buffers' unpinning with it, runs in the
	// kernel's workqueue after close returns.
	for wait := time.Now(); testenv.PinnedBytes(t) != before && time.Since(wait) < 10*time.Second; {
		time.Sleep(20 * time.Millisecond)
	}
	if pinned := testenv.PinnedBytes(t) - before; pinned != 0 {
		t.Errorf("10 s after close %d KiB still pinned", pinned>>10)
	}
}
