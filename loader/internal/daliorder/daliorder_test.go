// SPDX-License-Identifier: Apache-2.0

package daliorder

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"
)

// TestMatchesRealDALI replays testdata/dali.json, what DALI's
// fn.readers.file returned (testdata/gen_dali.py), case by case.
func TestMatchesRealDALI(t *testing.T) {
	b, err := os.ReadFile("testdata/dali.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		DALI   string `json:"dali"`
		Epochs int    `json:"epochs"`
		Cases  []struct {
			N             int    `json:"n"`
			BatchSize     int    `json:"batch_size"`
			InitialFill   int    `json:"initial_fill"`
			Seed          uint64 `json:"seed"`
			NumShards     int    `json:"num_shards"`
			ShardID       int    `json:"shard_id"`
			PadLastBatch  bool   `json:"pad_last_batch"`
			StickToShard  bool   `json:"stick_to_shard"`
			RandomShuffle bool   `json:"random_shuffle"`
			// ShuffleAfterEpoch's cases give shuffle_after_epoch_seed
			// where the pipeline passed one.
			ShuffleAfterEpoch     bool    `json:"shuffle_after_epoch"`
			ShuffleAfterEpochSeed *int64  `json:"shuffle_after_epoch_seed"`
			Samples               []int32 `json:"samples"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	if len(ref.Cases) < 10 || ref.Epochs < 2 {
		t.Fatalf("testdata holds %d cases of %d epochs", len(ref.Cases), ref.Epochs)
	}
	for _, c := range ref.Cases {
		p := Params{N: c.N, BatchSize: c.BatchSize, InitialFill: c.InitialFill, Seed: c.Seed, NumShards: c.NumShards,
			ShardID: c.ShardID, PadLastBatch: c.PadLastBatch, StickToShard: c.StickToShard, RandomShuffle: c.RandomShuffle,
			ShuffleAfterEpoch: c.ShuffleAfterEpoch, ShuffleAfterEpochSeed: FileListSeed}
		if c.ShuffleAfterEpochSeed != nil {
			p.ShuffleAfterEpochSeed = uint64(*c.ShuffleAfterEpochSeed) // DALI's int64, two's complement
		}
		t.Run(fmt.Sprintf("%+v", p), func(t *testing.T) {
			r := New(p)
			var got []int32
			for e := 0; e < ref.Epochs; e++ {
				got = append(got, r.Next(nil)...)
			}
			if len(c.Samples) < len(got) {
				t.Fatalf("DALI %s returned %d samples, %d epochs here are %d", ref.DALI, len(c.Samples), ref.Epochs, len(got))
			}
			if want := c.Samples[:len(got)]; !slices.Equal(got, want) {
				for i := range got {
					if got[i] != want[i] {
						t.Fatalf("sample %d is %d, DALI %s gave %d\n here %v\n DALI %v", i, got[i], ref.DALI, want[i], got, want)
					}
				}
			}
		})
	}
}

// params lists reader arguments over small datasets for the structural
// tests.
func params() []Params {
	var ps []Params
	for _, n := range []int{1, 2, 7, 20, 101} {
		for _, shards := range []int{1, 2, 3, 8} {
			if shards > n {
				continue
			}
			for _, bs := range []int{1, 3, 8} {
				for _, fill := range []int{1, 5, 1024} {
					for flags := range 8 {
						ps = append(ps, Params{N: n, BatchSize: bs, NumShards: shards, ShardID: (n + bs) % shards,
							InitialFill: fill, Seed: uint64(n*31 + fill), RandomShuffle: flags&1 != 0,
							PadLastBatch: flags&2 != 0, StickToShard: flags&4 != 0})
					}
				}
			}
		}
	}
	return ps
}

// TestEpochsAreShards: every epoch is a permutation of the shard DALI
// reads in it (shard k+e, or k with stick_to_shard, of the file list),
// padded with its last sample to ceil(N/n) and whole batches.
func TestEpochsAreShards(t *testing.T) {
	for _, p := range params() {
		r := New(p)
		list := FileOrder(p.N, nil)
		if !p.RandomShuffle {
			for i := range list {
				list[i] = int32(i)
			}
		}
		for e := range 4 {
			if r.Epoch() != e {
				t.Fatalf("%+v: Epoch() = %d, want %d", p, r.Epoch(), e)
			}
			got := r.Next(nil)
			k := (p.ShardID + e) % p.NumShards
			if p.StickToShard {
				k = p.ShardID
			}
			lo, hi := start(k, p.NumShards, p.N), start(k+1, p.NumShards, p.N)
			want := hi - lo
			if p.PadLastBatch {
				per := (p.N + p.NumShards - 1) / p.NumShards
				want = (per + p.BatchSize - 1) / p.BatchSize * p.BatchSize
			}
			if len(got) != want {
				t.Fatalf("%+v epoch %d: %d samples, want %d", p, e, len(got), want)
			}
			shard := slices.Sorted(slices.Values(list[lo:hi]))
			if own := slices.Sorted(slices.Values(got[:hi-lo])); !slices.Equal(own, shard) {
				t.Fatalf("%+v epoch %d: samples %v, shard %d is %v", p, e, got, k, shard)
			}
			for _, s := range got[hi-lo:] {
				if s != got[hi-lo-1] {
					t.Fatalf("%+v epoch %d: padding %v does not repeat the last sample", p, e, got[hi-lo:])
				}
			}
			if !p.RandomShuffle || p.InitialFill == 1 {
				if !slices.Equal(got[:hi-lo], list[lo:hi]) {
					t.Fatalf("%+v epoch %d: %v, want the list's order %v", p, e, got, list[lo:hi])
				}
			}
		}
	}
}

// TestLocalShuffle: a sample is returned at most initial_fill-1 places
// before it was read, and at most a few initial_fills after (the
// buffer's shuffle is local, unlike a permutation).
func TestLocalShuffle(t *testing.T) {
	const n, fill = 20000, 64
	p := Params{N: n, BatchSize: 32, NumShards: 1, InitialFill: fill, Seed: 3, RandomShuffle: true}
	readAt := map[int32]int{}
	for i, s := range FileOrder(n, nil) {
		readAt[s] = i
	}
	r := New(p)
	maxLate := 0
	for pos, s := range r.Next(nil) {
		d := pos - readAt[s]
		if d < -(fill - 1) {
			t.Fatalf("sample %d read at %d returned at %d: earlier than the buffer allows", s, readAt[s], pos)
		}
		maxLate = max(maxLate, d)
	}
	if maxLate < fill || maxLate > 40*fill {
		t.Errorf("the latest sample came %d places after its read, want about a few times initial_fill %d", maxLate, fill)
	}
}

// TestSkipIsNext: skipping an epoch leaves the reader where returning it
// does.
func TestSkipIsNext(t *testing.T) {
	p := Params{N: 101, BatchSize: 4, NumShards: 3, ShardID: 1, InitialFill: 16, Seed: 9, RandomShuffle: true, PadLastBatch: true}
	a, b := New(p), New(p)
	for range 3 {
		a.Next(nil)
		b.Skip(nil)
	}
	if x, y := a.Next(nil), b.Next(nil); !slices.Equal(x, y) {
		t.Errorf("after 3 epochs returned: %v; after 3 skipped: %v", x, y)
	}
}

func TestSeedLow32Bits(t *testing.T) {
	p := Params{N: 50, BatchSize: 4, NumShards: 1, InitialFill: 50, Seed: 5, RandomShuffle: true}
	q := p
	q.Seed = 5 + 1<<32
	if x, y := New(p).Next(nil), New(q).Next(nil); !slices.Equal(x, y) {
		t.Errorf("seeds 5 and 5+2^32 differ: DALI's seed_seq keeps 32 bits")
	}
	q.Seed = 6
	if x, y := New(p).Next(nil), New(q).Next(nil); slices.Equal(x, y) {
		t.Errorf("seeds 5 and 6 give the same order")
	}
}

func BenchmarkEpoch(b *testing.B) {
	p := Params{N: 160_000, BatchSize: 256, NumShards: 1, InitialFill: 1024, Seed: 1, RandomShuffle: true}
	r := New(p)
	buf := make([]int32, 0, p.N)
	b.ResetTimer()
	for b.Loop() {
		buf = r.Next(buf)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*p.N), "ns/sample")
}

// TestMemoryIsTheBuffer: a reader holds its file list and its buffer,
// whatever the arguments: an initial_fill far larger than a shard (the
// buffer then holds samples of many epochs) costs no more than the
// buffer's 4 bytes a sample. Before, a list entry per epoch in the buffer
// made N=1000 over 1000 shards with initial_fill 2^24 hold 372 MiB.
func TestMemoryIsTheBuffer(t *testing.T) {
	for _, p := range []Params{
		{N: 1000, BatchSize: 1, NumShards: 1000, InitialFill: 1 << 24, Seed: 1, RandomShuffle: true},
		{N: 1000, BatchSize: 7, NumShards: 3, ShardID: 2, InitialFill: 1 << 24, Seed: 2, RandomShuffle: true, StickToShard: true, PadLastBatch: true},
	} {
		t.Run(fmt.Sprintf("%+v", p), func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			r := New(p)
			for range 3 {
				r.Next(nil)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(r)
			limit := int64(4*p.InitialFill+4*p.N) + 8<<20
			if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > limit {
				t.Errorf("the reader holds %d MiB, want at most %d MiB (its buffer and list)", grew>>20, limit>>20)
			}
		})
	}
}

// TestSkipPaddingIsFree: skipping an epoch costs its own samples, not its
// padding: one-sample shards padded to batches of 65536 are skipped at
// the cost of one sample each. Before, each skipped epoch stepped through
// its 65535 repeats one by one (2^30 epochs, the replay bound: 83 hours).
func TestSkipPaddingIsFree(t *testing.T) {
	p := Params{N: 1000, BatchSize: 1 << 16, NumShards: 1000, ShardID: 7, InitialFill: 1024, Seed: 1, RandomShuffle: true, PadLastBatch: true}
	const epochs = 1 << 14
	r := New(p)
	t0 := time.Now()
	for range epochs {
		r.Skip(nil)
	}
	if took := time.Since(t0); took > time.Second {
		t.Errorf("%d epochs of one sample padded to %d took %s to skip, want well under a second", epochs, p.BatchSize, took)
	}
}

// TestSkipStops: a skip stops when its stop channel is closed, well
// before the end of a large epoch, and says so.
func TestSkipStops(t *testing.T) {
	p := Params{N: 1 << 22, BatchSize: 256, NumShards: 1, InitialFill: 1024, Seed: 1, RandomShuffle: true}
	r := New(p)
	stop := make(chan struct{})
	close(stop)
	t0 := time.Now()
	if r.Skip(stop) {
		t.Fatalf("a skip with its stop closed went to the end of the epoch")
	}
	if took := time.Since(t0); took > 100*time.Millisecond {
		t.Errorf("stopping took %s", took)
	}
	if q := New(p); !q.Skip(nil) || q.Epoch() != 1 {
		t.Errorf("a skip without stop did not end the epoch")
	}
}
