// SPDX-License-Identifier: Apache-2.0

package daliorder

import (
	"fmt"
	"slices"
	"testing"
)

// TestShuffleAfterEpochShards: with ShuffleAfterEpoch every epoch's
// shards (padding aside) are disjoint and together the whole dataset,
// each epoch's list differs from the last, the seed changes nothing (two
// readers of paired datasets of one length read the same positions), and
// padding repeats the shard's last sample up to ceil(N/n) and whole
// batches.
func TestShuffleAfterEpochShards(t *testing.T) {
	for _, c := range []struct{ n, shards, batch int }{{11, 2, 3}, {24, 1, 2}, {101, 4, 8}, {100, 3, 7}, {5, 5, 4}} {
		for _, pad := range []bool{false, true} {
			t.Run(fmt.Sprintf("n%d_shards%d_b%d_pad%v", c.n, c.shards, c.batch, pad), func(t *testing.T) {
				const epochs = 4
				var readers [][]*Reader
				for seed := range uint64(2) {
					var rs []*Reader
					for k := range c.shards {
						rs = append(rs, New(Params{N: c.n, BatchSize: c.batch, ShardID: k, NumShards: c.shards,
							Seed: seed * 977, PadLastBatch: pad, ShuffleAfterEpoch: true}))
					}
					readers = append(readers, rs)
				}
				var prev []int32
				for e := range epochs {
					var all []int32
					for k := range c.shards {
						got := readers[0][k].Next(nil)
						if other := readers[1][k].Next(nil); !slices.Equal(got, other) {
							t.Fatalf("epoch %d shard %d: seed 0 read %v, seed 977 %v", e, k, got, other)
						}
						lo, hi := start(k, c.shards, c.n), start(k+1, c.shards, c.n)
						own := got[:hi-lo]
						for _, s := range got[hi-lo:] {
							if !pad || s != own[len(own)-1] {
								t.Fatalf("epoch %d shard %d: %v past its %d samples", e, k, got, hi-lo)
							}
						}
						if per := (c.n + c.shards - 1) / c.shards; pad && len(got) != (per+c.batch-1)/c.batch*c.batch {
							t.Fatalf("epoch %d shard %d: %d samples with padding", e, k, len(got))
						}
						all = append(all, own...)
					}
					slices.Sort(all)
					for i, s := range all {
						if s != int32(i) {
							t.Fatalf("epoch %d: the shards hold %v, not every sample once", e, all)
						}
					}
					if first := readers[0][0]; e > 0 && c.n > 5 && slices.Equal(prev, first.list) {
						t.Fatalf("epoch %d: the list was not shuffled again", e)
					}
					prev = slices.Clone(readers[0][0].list)
				}
			})
		}
	}
}

// TestShuffleAfterEpochFirstList: epoch 0 reads the list permuted once
// with std::mt19937_64(shuffle_after_epoch_seed + 2^32), as DALI 2.4's
// first reset does; the seed defaults to FileListSeed.
func TestShuffleAfterEpochFirstList(t *testing.T) {
	for _, c := range []struct {
		seed uint64
		want []int32 // what DALI 2.4's fn.readers.numpy(shuffle_after_epoch=True) returned
	}{
		{FileListSeed, []int32{18, 16, 19, 14, 20, 2, 8, 15, 23, 3, 11, 17, 6, 12, 5, 1, 22, 10, 9, 0, 4, 13, 21, 7}},
		{0, []int32{7, 13, 10, 21, 17, 12, 15, 19, 8, 3, 4, 2, 18, 20, 16, 23, 14, 9, 0, 11, 6, 1, 5, 22}},
	} {
		r := New(Params{N: 24, BatchSize: 24, NumShards: 1, ShuffleAfterEpoch: true, ShuffleAfterEpochSeed: c.seed})
		if got := r.Next(nil); !slices.Equal(got, c.want) {
			t.Errorf("shuffle_after_epoch_seed %d: epoch 0 %v, DALI 2.4 %v", c.seed, got, c.want)
		}
	}
}
