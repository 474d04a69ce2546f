// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestShardingFormulas(t *testing.T) {
	for _, n := range []int{1, 7, 19, 100, 1001} {
		for _, shards := range []int{1, 2, 3, 4, 8} {
			for _, bs := range []int{1, 3, 64} {
				for _, pad := range []bool{false, true} {
					for _, stick := range []bool{false, true} {
						name := fmt.Sprintf("N%d/n%d/b%d/pad%v/stick%v", n, shards, bs, pad, stick)
						for k := 0; k < shards; k++ {
							s := Sampling{N: n, ReaderArgs: ReaderArgs{BatchSize: bs, ShardID: k, NumShards: shards, PadLastBatch: pad, StickToShard: stick}}
							if shards > n {
								if s.Validate() == nil {
									t.Errorf("%s: %d shards of %d samples accepted", name, shards, n)
								}
								continue
							}
							if err := s.Validate(); err != nil {
								t.Fatalf("%s: %v", name, err)
							}
							for e := 0; e < 3; e++ {
								checkEpoch(t, name, s, k, e)
							}
						}
					}
				}
			}
		}
	}
}

func checkEpoch(t *testing.T, name string, s Sampling, k, e int) {
	t.Helper()
	shard := (k + e) % s.NumShards
	if s.StickToShard {
		shard = k
	}
	lo, hi := shard*s.N/s.NumShards, (shard+1)*s.N/s.NumShards
	order, _ := s.EpochOrder(e, nil, nil)
	wantLen := hi - lo
	if s.PadLastBatch {
		per := (s.N + s.NumShards - 1) / s.NumShards
		wantLen = (per + s.BatchSize - 1) / s.BatchSize * s.BatchSize
	}
	if len(order) != wantLen || s.EpochSamples(e) != wantLen || s.EpochBatches(e) != (wantLen+s.BatchSize-1)/s.BatchSize {
		t.Fatalf("%s rank %d epoch %d: %d samples (%d batches), want %d", name, k, e, len(order), s.EpochBatches(e), wantLen)
	}
	for i, idx := range order {
		want := lo + i
		if i >= hi-lo {
			want = hi - 1 // padding repeats the last sample
		}
		if int(idx) != want {
			t.Fatalf("%s rank %d epoch %d: position %d is %d, want %d", name, k, e, i, idx, want)
		}
	}
}

func TestShardsPartitionEveryEpoch(t *testing.T) {
	for _, shuffle := range []bool{false, true} {
		for _, n := range []int{7, 100, 1001} {
			for _, shards := range []int{1, 3, 8} {
				seen := make([]int, n)
				for e := 0; e < 4; e++ {
					clear(seen)
					for k := 0; k < shards; k++ {
						s := Sampling{N: n, ReaderArgs: ReaderArgs{BatchSize: 5, ShardID: k, NumShards: shards, RandomShuffle: shuffle, Seed: 11}}
						order, _ := s.EpochOrder(e, nil, nil)
						for _, i := range order {
							seen[i]++
						}
					}
					for i, c := range seen {
						if c != 1 {
							t.Fatalf("shuffle=%v N=%d n=%d epoch %d: sample %d read %d times", shuffle, n, shards, e, i, c)
						}
					}
				}
			}
		}
	}
}

// orderHash hashes the first epochs' orders of a shuffled sampler.
func orderHash(seed uint64) string {
	h := sha256.New()
	for e := 0; e < 3; e++ {
		s := Sampling{N: 10007, ReaderArgs: ReaderArgs{BatchSize: 64, NumShards: 1, RandomShuffle: true, Seed: seed}}
		order, _ := s.EpochOrder(e, nil, nil)
		binary.Write(h, binary.LittleEndian, order)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestShufflePinned pins the permutation to fixed digests: a saved State
// replays the same sequence only while the permutation is unchanged, so a
// change to it must be made on purpose (with a new StateVersion and new
// digests here), never by accident.
func TestShufflePinned(t *testing.T) {
	for _, tt := range []struct {
		seed uint64
		want string
	}{
		{42, "40743ebc61f38dc4d9d4584718a863e3e25cbb6e48e7d74d06aa77c73b0b5ade"},
		{7, "b447044d195c1410469088e434e3747891391c6216bc4983a35a7ad092c9cc1f"},
	} {
		if got := orderHash(tt.seed); got != tt.want {
			t.Errorf("seed %d: the first 3 epochs of 10007 samples hash to %s, pinned %s: the permutation changed (saved states would replay other samples)", tt.seed, got, tt.want)
		}
	}
}

func TestShuffleDeterministicAcrossProcesses(t *testing.T) {
	if os.Getenv("NVFEED_ORDER_HASH") == "1" {
		fmt.Print(orderHash(42))
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestShuffleDeterministicAcrossProcesses$")
	cmd.Env = append(os.Environ(), "NVFEED_ORDER_HASH=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(out), orderHash(42); got != want {
		t.Errorf("another process drew %s, this one %s", got, want)
	}
	if orderHash(42) == orderHash(43) {
		t.Error("different seeds gave the same orders")
	}
	s := Sampling{N: 1000, ReaderArgs: ReaderArgs{BatchSize: 1, NumShards: 1, RandomShuffle: true, Seed: 42}}
	e0, _ := s.EpochOrder(0, nil, nil)
	e1, _ := s.EpochOrder(1, nil, nil)
	if slices.Equal(e0, e1) {
		t.Error("epochs 0 and 1 have the same order")
	}
	sorted := slices.Clone(e0)
	slices.Sort(sorted)
	for i, v := range sorted {
		if int(v) != i {
			t.Fatalf("epoch order is not a permutation")
		}
	}
}

// TestShuffleMixesClasses checks the property DALI's 1024-sample buffer
// lacks: on class-ordered data (100 classes of 1000), a batch of 64 draws
// from many classes.
func TestShuffleMixesClasses(t *testing.T) {
	s := Sampling{N: 100_000, ReaderArgs: ReaderArgs{BatchSize: 64, NumShards: 1, RandomShuffle: true, Seed: 1}}
	order, _ := s.EpochOrder(0, nil, nil)
	classes := map[int32]bool{}
	for _, i := range order[:64] {
		classes[i/1000] = true
	}
	if len(classes) < 40 {
		t.Errorf("first batch spans %d classes, want a global mix (>= 40)", len(classes))
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		s    Sampling
		want string
	}{
		{Sampling{N: 0, ReaderArgs: ReaderArgs{BatchSize: 1, NumShards: 1}}, "no samples"},
		{Sampling{N: 5, ReaderArgs: ReaderArgs{BatchSize: 0, NumShards: 1}}, "batch_size 0"},
		{Sampling{N: 5, ReaderArgs: ReaderArgs{BatchSize: 1 << 20, NumShards: 1}}, "batch_size"},
		{Sampling{N: 5, ReaderArgs: ReaderArgs{BatchSize: 1, NumShards: 0}}, "num_shards 0"},
		{Sampling{N: 5, ReaderArgs: ReaderArgs{BatchSize: 1, ShardID: 2, NumShards: 2}}, "shard_id 2"},
		{Sampling{N: 5, ReaderArgs: ReaderArgs{BatchSize: 1, ShardID: -1, NumShards: 2}}, "shard_id -1"},
	}
	for _, tt := range tests {
		err := tt.s.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: err = %v, want %q", tt.s, err, tt.want)
		}
	}
}
