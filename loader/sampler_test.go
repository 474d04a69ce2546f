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

	"github.com/nvfeed/nvfeed/loader/internal/daliorder"
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
	for _, mode := range []string{"", ShufflePermute, ShuffleDALI} {
		for _, shuffle := range []bool{false, true} {
			for _, stick := range []bool{false, true} {
				for _, n := range []int{7, 100, 1001} {
					for _, shards := range []int{1, 3, 8} {
						if shards > n {
							continue // refused: Validate
						}
						seen := make([]int, n)
						for e := 0; e < 4; e++ {
							clear(seen)
							for k := 0; k < shards; k++ {
								s := Sampling{N: n, ReaderArgs: ReaderArgs{BatchSize: 5, ShardID: k, NumShards: shards, RandomShuffle: shuffle,
									Seed: 11, StickToShard: stick, Shuffle: mode, InitialFill: 16}}
								order, _ := s.EpochOrder(e, nil, nil)
								for _, i := range order {
									seen[i]++
								}
							}
							for i, c := range seen {
								if c != 1 {
									t.Fatalf("shuffle=%q random_shuffle=%v stick=%v N=%d n=%d epoch %d: sample %d read %d times", mode, shuffle, stick, n, shards, e, i, c)
								}
							}
						}
					}
				}
			}
		}
	}
}

// TestStickToShardKeepsSamples: with stick_to_shard a rank reads the same
// samples every epoch, shuffled or not, in either shuffle: DALI's shard,
// the one fn.readers.file's rank reads (a range of its fixed list order).
func TestStickToShardKeepsSamples(t *testing.T) {
	for _, mode := range []string{ShufflePermute, ShuffleDALI} {
		for _, shuffle := range []bool{false, true} {
			for _, pad := range []bool{false, true} {
				for _, tt := range []struct{ n, shards, k int }{{999, 1, 0}, {2000, 2, 1}, {1001, 3, 2}, {100, 8, 5}} {
					s := Sampling{N: tt.n, ReaderArgs: ReaderArgs{BatchSize: 7, ShardID: tt.k, NumShards: tt.shards, RandomShuffle: shuffle,
						Seed: 5, StickToShard: true, PadLastBatch: pad, Shuffle: mode, InitialFill: 64}}
					lo, hi := s.ShardRange(tt.k)
					want := make([]int32, hi-lo)
					for i := range want {
						want[i] = int32(lo + i)
					}
					if shuffle {
						want = slices.Sorted(slices.Values(daliorder.FileOrder(tt.n, nil)[lo:hi]))
					}
					o := s.Orders()
					var first []int32
					for e := 0; e < 4; e++ {
						order := o.Epoch(e, nil)
						got := slices.Sorted(slices.Values(order[:hi-lo]))
						if !slices.Equal(got, want) {
							kept := 0
							for _, x := range got {
								if _, ok := slices.BinarySearch(want, x); ok {
									kept++
								}
							}
							t.Fatalf("shuffle %s random_shuffle=%v pad=%v %+v epoch %d: %d of DALI's %d shard samples", mode, shuffle, pad, tt, e, kept, len(want))
						}
						if e == 0 {
							first = order
						} else if shuffle && slices.Equal(first, order) {
							t.Errorf("shuffle %s %+v: epoch %d has epoch 0's order", mode, tt, e)
						}
					}
				}
			}
		}
	}
}

// TestOrdersSeek: Orders gives every epoch the same order however it gets
// there (in turn, backwards, skipping ahead, afresh as EpochOrder).
func TestOrdersSeek(t *testing.T) {
	for _, mode := range []string{ShufflePermute, ShuffleDALI} {
		for _, stick := range []bool{false, true} {
			s := Sampling{N: 203, ReaderArgs: ReaderArgs{BatchSize: 8, ShardID: 1, NumShards: 3, RandomShuffle: true, Seed: 17,
				PadLastBatch: true, StickToShard: stick, Shuffle: mode, InitialFill: 50}}
			o := s.Orders()
			var inTurn [][]int32
			for e := 0; e < 6; e++ {
				inTurn = append(inTurn, o.Epoch(e, nil))
			}
			seek := s.Orders()
			for _, e := range []int{4, 2, 5, 0, 3, 3, 1} {
				if got := seek.Epoch(e, nil); !slices.Equal(got, inTurn[e]) {
					t.Errorf("shuffle %s stick=%v: epoch %d reached by a seek differs", mode, stick, e)
				}
				if got, _ := s.EpochOrder(e, nil, nil); !slices.Equal(got, inTurn[e]) {
					t.Errorf("shuffle %s stick=%v: EpochOrder(%d) differs", mode, stick, e)
				}
			}
		}
	}
}

// TestDALIShuffleIsDALIs: Sampling with ShuffleDALI gives package
// daliorder's sequence (itself checked against real DALI), epoch by epoch;
// without random_shuffle both shuffles give DALI's sequential order.
func TestDALIShuffleIsDALIs(t *testing.T) {
	for _, shuffle := range []bool{false, true} {
		for _, stick := range []bool{false, true} {
			for _, pad := range []bool{false, true} {
				a := ReaderArgs{BatchSize: 6, ShardID: 2, NumShards: 4, RandomShuffle: shuffle, Seed: 1 << 40, PadLastBatch: pad,
					StickToShard: stick, Shuffle: ShuffleDALI, InitialFill: 30}
				s := Sampling{N: 250, ReaderArgs: a}
				r := daliorder.New(daliorder.Params{N: 250, BatchSize: 6, ShardID: 2, NumShards: 4, RandomShuffle: shuffle, Seed: 1 << 40,
					PadLastBatch: pad, StickToShard: stick, InitialFill: 30})
				permute := s
				permute.Shuffle = ShufflePermute
				o := s.Orders()
				for e := 0; e < 5; e++ {
					want := r.Next(nil)
					if got := o.Epoch(e, nil); !slices.Equal(got, want) {
						t.Fatalf("%+v epoch %d:\n got %v\nwant %v", a, e, got, want)
					}
					if p, _ := permute.EpochOrder(e, nil, nil); !shuffle && !slices.Equal(p, want) {
						t.Fatalf("%+v epoch %d: permute without random_shuffle gives %v, DALI %v", a, e, p, want)
					}
				}
			}
		}
	}
}

// orderHash hashes the first epochs' orders of a shuffled sampler.
func orderHash(seed uint64) string {
	return hashOrders(Sampling{N: 10007, ReaderArgs: ReaderArgs{BatchSize: 64, NumShards: 1, RandomShuffle: true, Seed: seed}})
}

// listedHash is orderHash of the listed permutation (version 3 states).
func listedHash(seed uint64) string {
	return hashOrders(Sampling{N: 10007, ReaderArgs: ReaderArgs{BatchSize: 64, NumShards: 1, RandomShuffle: true, Seed: seed}, listed: true})
}

// hashOrders hashes the first 3 epochs' orders of s.
func hashOrders(s Sampling) string {
	h := sha256.New()
	o := s.Orders()
	for e := 0; e < 3; e++ {
		binary.Write(h, binary.LittleEndian, o.Epoch(e, nil))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestShufflePinned pins the permutation to fixed digests: a saved State
// replays the same sequence only while the permutation is unchanged, so a
// change to it must be made on purpose (with a new StateVersion and new
// digests here), never by accident.
func TestShufflePinned(t *testing.T) {
	for _, tt := range []struct {
		name string
		hash func(uint64) string
		seed uint64
		want string
	}{
		{"computed", orderHash, 42, "cd6af8b07e43380f5896ad64acc240cac8aceb2fc58005f0f3f35ea5fa48a2cd"},
		{"computed", orderHash, 7, "ff50f51a90bcf153b3679320205885ca749fc635cf5c234db25b0f6694b3c02f"},
		{"listed (version 3)", listedHash, 42, "40743ebc61f38dc4d9d4584718a863e3e25cbb6e48e7d74d06aa77c73b0b5ade"},
		{"listed (version 3)", listedHash, 7, "b447044d195c1410469088e434e3747891391c6216bc4983a35a7ad092c9cc1f"},
	} {
		if got := tt.hash(tt.seed); got != tt.want {
			t.Errorf("%s, seed %d: the first 3 epochs of 10007 samples hash to %s, pinned %s: the permutation changed (saved states would replay other samples)", tt.name, tt.seed, got, tt.want)
		}
	}
	for _, tt := range []struct {
		args ReaderArgs
		want string
	}{
		{ReaderArgs{BatchSize: 64, ShardID: 1, NumShards: 3, RandomShuffle: true, Seed: 42, StickToShard: true},
			"c2c4b4c0e27a9b3619fa1fd6c6ca9683facea97e16a345c45714a84bb20fcc68"},
		{ReaderArgs{BatchSize: 64, ShardID: 1, NumShards: 3, RandomShuffle: true, Seed: 42, Shuffle: ShuffleDALI, InitialFill: 1024},
			"51a2d0b7609d42500e2993e91ade8284bf3f3981c5591bf4cdb79592d1610fb6"},
		{ReaderArgs{BatchSize: 64, ShardID: 2, NumShards: 3, RandomShuffle: true, Seed: 7, Shuffle: ShuffleDALI, InitialFill: 100, PadLastBatch: true, StickToShard: true},
			"1dcb34086a89f09626d29744adc5acd8a7380b8172fec0ddfcc2a8537bd4314a"},
	} {
		if got := hashOrders(Sampling{N: 10007, ReaderArgs: tt.args}); got != tt.want {
			t.Errorf("%+v: the first 3 epochs of 10007 samples hash to %s, pinned %s: the order changed (saved states would replay other samples)", tt.args, got, tt.want)
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

// TestShuffleMixesClasses: on class-ordered data (100 classes of 1000), a
// batch of 64 draws from many classes.
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
		{Sampling{N: 5, ReaderArgs: ReaderArgs{BatchSize: 1, NumShards: 1, Shuffle: "buffer"}}, `shuffle "buffer" (want "permute" or "dali"`},
		{Sampling{N: 5, ReaderArgs: ReaderArgs{BatchSize: 1, NumShards: 1, Shuffle: "DALI"}}, `shuffle "DALI"`},
		{Sampling{N: 5, ReaderArgs: ReaderArgs{BatchSize: 1, NumShards: 1, InitialFill: -1}}, "initial_fill -1 not in [1, 16777216] (0 means 1024)"},
		{Sampling{N: 5, ReaderArgs: ReaderArgs{BatchSize: 1, NumShards: 1, InitialFill: MaxInitialFill + 1}}, "initial_fill 16777217"},
	}
	for _, tt := range tests {
		err := tt.s.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: err = %v, want %q", tt.s, err, tt.want)
		}
	}
}

// TestShuffleAfterEpochOrders: with ShuffleAfterEpoch the ranks' epochs
// are disjoint and cover the dataset, any seed reads the same order, and
// an epoch reached by a seek (a replay) is the one reached in turn.
func TestShuffleAfterEpochOrders(t *testing.T) {
	const n, shards, epochs = 53, 3, 5
	for _, pad := range []bool{false, true} {
		inTurn := make([][][]int32, shards)
		for k := range shards {
			o := Sampling{N: n, ReaderArgs: ReaderArgs{BatchSize: 4, ShardID: k, NumShards: shards, PadLastBatch: pad,
				ShuffleAfterEpoch: true, Seed: uint64(k) * 12345}}.Orders()
			for e := range epochs {
				inTurn[k] = append(inTurn[k], slices.Clone(o.Epoch(e, nil)))
			}
		}
		for e := range epochs {
			seen := map[int32]bool{}
			for k := range shards {
				s := Sampling{N: n, ReaderArgs: ReaderArgs{BatchSize: 4, ShardID: k, NumShards: shards, PadLastBatch: pad, ShuffleAfterEpoch: true}}
				if sought, _ := s.EpochOrder(e, nil, nil); !slices.Equal(sought, inTurn[k][e]) {
					t.Fatalf("pad %v shard %d epoch %d: sought %v, in turn %v", pad, k, e, sought, inTurn[k][e])
				}
				lo, hi := s.ShardRange(k)
				for _, i := range inTurn[k][e][:hi-lo] {
					if seen[i] {
						t.Fatalf("pad %v epoch %d: sample %d read by two ranks", pad, e, i)
					}
					seen[i] = true
				}
			}
			if len(seen) != n {
				t.Fatalf("pad %v epoch %d: %d of %d samples read", pad, e, len(seen), n)
			}
		}
		if slices.Equal(inTurn[0][0], inTurn[0][1]) {
			t.Fatalf("pad %v: epochs 0 and 1 of shard 0 read %v both", pad, inTurn[0][0])
		}
	}
}

// TestShuffleAfterEpochSeed: shuffle_after_epoch_seed picks the lists
// (DALI 2.4's: epoch 0 of 24 samples), nil is DALI's default seed, and a
// saved state names a seed that differs.
func TestShuffleAfterEpochSeed(t *testing.T) {
	order := func(seed *int64) []int32 {
		s := Sampling{N: 24, ReaderArgs: ReaderArgs{BatchSize: 24, NumShards: 1, ShuffleAfterEpoch: true, ShuffleAfterEpochSeed: seed}}
		o, _ := s.EpochOrder(0, nil, nil)
		return o
	}
	for _, c := range []struct {
		seed *int64
		want []int32 // DALI 2.4's fn.readers.numpy(shuffle_after_epoch=True, shuffle_after_epoch_seed=seed)
	}{
		{nil, []int32{18, 16, 19, 14, 20, 2, 8, 15, 23, 3, 11, 17, 6, 12, 5, 1, 22, 10, 9, 0, 4, 13, 21, 7}},
		{new(int64(DefaultShuffleAfterEpochSeed)), []int32{18, 16, 19, 14, 20, 2, 8, 15, 23, 3, 11, 17, 6, 12, 5, 1, 22, 10, 9, 0, 4, 13, 21, 7}},
		{new(int64(0)), []int32{7, 13, 10, 21, 17, 12, 15, 19, 8, 3, 4, 2, 18, 20, 16, 23, 14, 9, 0, 11, 6, 1, 5, 22}},
	} {
		if got := order(c.seed); !slices.Equal(got, c.want) {
			t.Errorf("seed %v: epoch 0 %v, DALI %v", c.seed, got, c.want)
		}
	}
	a := Sampling{N: 24, ReaderArgs: ReaderArgs{BatchSize: 2, NumShards: 1, ShuffleAfterEpoch: true}}
	b := a
	b.ShuffleAfterEpochSeed = new(int64(3))
	if d := a.diff(b); d != "shuffle_after_epoch_seed 524287 (now 3)" {
		t.Errorf("diff %q", d)
	}
}
