// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// run is one run of a resumed epoch: its ranks, batch size, and the
// batches each receives before the crash (-1: the rest of the epoch).
type run struct{ shards, batch, batches int }

// received returns the samples the ranks of one run receive in epoch e
// resumed through stages, padding excluded.
func received(base Sampling, e int, stages []Stage, r run) []int32 {
	var got []int32
	for k := range r.shards {
		s := base
		s.NumShards, s.ShardID, s.BatchSize = r.shards, k, r.batch
		s = s.Resumed(e, stages)
		order, _ := s.EpochOrder(e, nil, nil)
		lo, hi := s.epochShard(e)
		n := hi - lo
		if r.batches >= 0 {
			n = min(n, r.batches*r.batch)
		}
		got = append(got, order[:n]...)
	}
	return got
}

func TestResumeEveryRankCount(t *testing.T) {
	chains := map[string][]run{
		"4-3-2":         {{4, 8, 3}, {3, 8, 2}, {2, 8, -1}},
		"batch size":    {{4, 8, 3}, {3, 5, 2}, {2, 16, -1}},
		"grow":          {{2, 4, 5}, {5, 4, 1}, {8, 3, -1}},
		"at start":      {{4, 8, 0}, {3, 8, -1}},
		"past the end":  {{4, 8, 100}, {2, 8, -1}},
		"fewer than W'": {{4, 2, 11}, {3, 2, 1}, {7, 1, -1}},
		"same shards":   {{3, 4, 2}, {3, 4, 1}, {3, 4, -1}},
	}
	modes := map[string]Sampling{
		"in order":         {},
		"permute":          {ReaderArgs: ReaderArgs{RandomShuffle: true, Seed: 7}},
		"permute listed":   {ReaderArgs: ReaderArgs{RandomShuffle: true, Seed: 7}, listed: true},
		"webdataset":       {WebDataset: true},
		"webdataset shuff": {WebDataset: true, ReaderArgs: ReaderArgs{RandomShuffle: true, Seed: 7}},
	}
	for cname, chain := range chains {
		for mname, mode := range modes {
			for _, n := range []int{47, 100, 1001} {
				for _, pad := range []bool{false, true} {
					name := fmt.Sprintf("%s/%s/N%d/pad%v", cname, mname, n, pad)
					base := mode
					base.N, base.PadLastBatch = n, pad
					base.ReaderArgs = base.ReaderArgs.withDefaults()
					const e = 1
					var stages []Stage
					var got []int32
					for _, r := range chain {
						got = append(got, received(base, e, stages, r)...)
						left := base.Resumed(e, stages).epochLen(e)
						most := ((left+r.shards-1)/r.shards + r.batch - 1) / r.batch // the largest shard's batches
						stages = append(stages, Stage{NumShards: r.shards, BatchSize: r.batch, Batch: min(max(r.batches, 0), most)})
						st := State{Version: StateVersion, Sampling: base, Epoch: e, Stages: stages}
						st.Sampling.NumShards, st.Sampling.BatchSize = 1, 1
						if err := st.Validate(); err != nil {
							t.Fatalf("%s: the state after run %+v: %v", name, r, err)
						}
					}
					slices.Sort(got)
					for i, v := range got {
						if int(v) != i {
							t.Fatalf("%s: %d samples, sorted position %d is %d: not every sample once", name, len(got), i, v)
						}
					}
					if len(got) != n {
						t.Fatalf("%s: %d samples, want %d", name, len(got), n)
					}
					checkNextEpochFresh(t, name, base, stages)
				}
			}
		}
	}
}

// checkNextEpochFresh checks that the epoch after a resumed one is a fresh
// run's.
func checkNextEpochFresh(t *testing.T, name string, base Sampling, stages []Stage) {
	t.Helper()
	base.NumShards, base.ShardID, base.BatchSize = 2, 1, 4
	want, _ := base.EpochOrder(2, nil, nil)
	got, _ := base.Resumed(1, stages).EpochOrder(2, nil, nil)
	if !slices.Equal(got, want) {
		t.Fatalf("%s: epoch 2 after the resumed epoch 1 is not a fresh run's", name)
	}
}

func TestResumeComputedBatches(t *testing.T) {
	// A computed sampling's batches, one at a time, are its epoch order.
	for _, wds := range []bool{true, false} {
		s := Sampling{N: 1001, WebDataset: wds, ReaderArgs: ReaderArgs{RandomShuffle: true, Seed: 3, NumShards: 3, ShardID: 2, BatchSize: 7, PadLastBatch: true}}
		s = s.Resumed(4, []Stage{{NumShards: 4, BatchSize: 9, Batch: 10}, {NumShards: 2, BatchSize: 5, Batch: 3}})
		order, _ := s.EpochOrder(4, nil, nil)
		var got []int32
		for b := range s.EpochBatches(4) {
			got = s.batchAt(4, b, got)
		}
		if !s.computed() || !slices.Equal(got, order) || len(order) != s.EpochSamples(4) {
			t.Fatalf("webdataset %v: batches %v, order %v", wds, got, order)
		}
	}
}

func TestResumeRefused(t *testing.T) {
	stage := []Stage{{NumShards: 4, BatchSize: 8, Batch: 2}}
	tests := []struct {
		name string
		args ReaderArgs
		st   []Stage
		want string
	}{
		{"dali shuffle", ReaderArgs{RandomShuffle: true, Shuffle: ShuffleDALI}, stage, `shuffle="dali"`},
		{"stick to shard", ReaderArgs{StickToShard: true}, stage, "stick_to_shard"},
		{"shuffle after epoch", ReaderArgs{ShuffleAfterEpoch: true}, stage, "shuffle_after_epoch"},
		{"past the largest shard", ReaderArgs{}, []Stage{{NumShards: 4, BatchSize: 8, Batch: 5}}, "batch 5 not in [0, 4]"},
		{"no shards", ReaderArgs{}, []Stage{{NumShards: 0, BatchSize: 8}}, "num_shards 0"},
		{"too many", ReaderArgs{}, make([]Stage, MaxStages+1), "stages, at most"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := tt.args
			a.NumShards, a.BatchSize = 2, 4
			st := State{Version: StateVersion, Sampling: Sampling{N: 100, ReaderArgs: a.withDefaults()}, Epoch: 1, Stages: tt.st}
			err := st.Validate()
			if !errors.Is(err, ErrOptions) || !strings.Contains(fmt.Sprint(err), tt.want) {
				t.Fatalf("got %v, want ErrOptions saying %q", err, tt.want)
			}
		})
	}
	old := State{Version: 2, Sampling: Sampling{N: 100, ReaderArgs: ReaderArgs{NumShards: 1, BatchSize: 4}.withDefaults()}, Epoch: 1, Stages: stage}
	if err := old.Validate(); err == nil {
		t.Fatal("a version 2 state with stages accepted")
	}
}

// TestResumeAt100M measures an open at 100 M samples, fresh and resumed
// (the sampling resumed through two stages), to its first batch: under a
// second for every order the producer computes (webdataset, files and
// numpy with permute, the list in order), with one batch's indices of
// sampler memory.
func TestResumeAt100M(t *testing.T) {
	if testing.Short() || raceOn {
		t.Skip("100 M samples, timed: not with -short or -race")
	}
	const n = 100_000_000
	stages := []Stage{{NumShards: 4, BatchSize: 256, Batch: 40_000}, {NumShards: 3, BatchSize: 128, Batch: 1_000}}
	tests := []struct {
		name string
		s    Sampling
	}{
		{"webdataset permute", Sampling{WebDataset: true, ReaderArgs: ReaderArgs{RandomShuffle: true, Seed: 1}}},
		{"files and numpy permute", Sampling{ReaderArgs: ReaderArgs{RandomShuffle: true, Seed: 1}}},
		{"in order", Sampling{}},
	}
	for _, tt := range tests {
		for _, st := range [][]Stage{nil, stages} {
			s := tt.s
			s.N, s.NumShards, s.ShardID, s.BatchSize = n, 2, 1, 512
			s.ReaderArgs = s.ReaderArgs.withDefaults()
			start := time.Now()
			state := State{Version: StateVersion, Sampling: s, Epoch: 3, Stages: st}
			if err := state.Validate(); err != nil {
				t.Fatal(err)
			}
			r := s.Resumed(3, st)
			if !r.computed() || SamplerBytes(r) != 4*512 {
				t.Fatalf("%s: computed %v, SamplerBytes %d: want a computed order in one batch's indices", tt.name, r.computed(), SamplerBytes(r))
			}
			first := r.batchAt(3, 0, nil)
			took := time.Since(start)
			t.Logf("%s, %d stages: opened at %d samples, first batch in %v", tt.name, len(st), n, took)
			if len(first) != r.BatchSize || took > time.Second {
				t.Errorf("%s: %d samples in %v, want %d within a second", tt.name, len(first), took, r.BatchSize)
			}
		}
	}
}

// TestResumeLoader: loaders opened at a resumed state read its epoch's
// remainder, each sample once across their ranks, and say so in State.
func TestResumeLoader(t *testing.T) {
	m := makeDataset(t, 101, 5, 3000)
	stages := []Stage{{NumShards: 4, BatchSize: 8, Batch: 2}}
	base := Sampling{N: 101, ReaderArgs: ReaderArgs{RandomShuffle: true, Seed: 3}.withDefaults()}
	got := received(base, 1, nil, run{shards: 4, batch: 8, batches: 2})
	for k := range 3 {
		o := Options{ReaderArgs: ReaderArgs{BatchSize: 5, NumShards: 3, ShardID: k, RandomShuffle: true, Seed: 3}, PrefetchQueueDepth: 2}
		st := State{Version: StateVersion, Sampling: Sampling{N: 101, ReaderArgs: o.ReaderArgs.withDefaults()}, Epoch: 1, Stages: stages}
		o.State = &st
		l, err := New(context.Background(), m, o)
		if err != nil {
			t.Fatal(err)
		}
		if s := l.State(); !slices.Equal(s.Stages, stages) || s.Epoch != 1 || s.Batch != 0 {
			t.Errorf("rank %d: state at open %+v, want epoch 1 batch 0 with the stages", k, s)
		}
		got = append(got, collectEpoch(t, l, m, true)...)
		l.Close()
	}
	slices.Sort(got)
	for i, v := range got {
		if int(v) != i || len(got) != 101 {
			t.Fatalf("%d samples, sorted position %d is %d: not every sample once", len(got), i, v)
		}
	}
}
