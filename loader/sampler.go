// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"strings"
)

// Sampling is the part of the options that decides which samples a rank
// reads in which order. It is pure: the same Sampling gives the same
// sequence in every process.
//
// Semantics follow DALI's fn.readers.file: shard k of n is the index range
// [floor(k·N/n), floor((k+1)·N/n)); in epoch e a rank reads shard
// (k+e) mod n unless StickToShard. With PadLastBatch every shard yields
// ceil(N/n) samples (the last sample repeats), padded further to whole
// batches; without it the shard's last batch is partial.
//
// Shuffling differs from DALI on purpose: DALI shuffles through a
// 1024-sample buffer, which on class-ordered data leaves each batch
// dominated by a few classes. Here RandomShuffle draws a full permutation of
// all N samples per epoch from (Seed, epoch), the same on every rank, and
// the shards are ranges of that permutation: ranks stay disjoint within an
// epoch and mixing is global.
type Sampling struct {
	N          int `json:"n" msgpack:"n"` // samples in the dataset
	ReaderArgs `msgpack:",inline"`
}

// ReaderArgs are the sampling arguments of DALI's fn.readers.file, with
// its names: one type from the wire (the daemon's open request) through
// the session to Options and Sampling.
type ReaderArgs struct {
	BatchSize     int    `json:"batch_size" msgpack:"batch_size"`         // samples per batch
	ShardID       int    `json:"shard_id" msgpack:"shard_id"`             // this rank, in [0, NumShards)
	NumShards     int    `json:"num_shards" msgpack:"num_shards"`         // ranks; 0 means 1 in Options
	RandomShuffle bool   `json:"random_shuffle" msgpack:"random_shuffle"` // permute all samples every epoch
	Seed          uint64 `json:"seed" msgpack:"seed"`                     // permutation seed
	PadLastBatch  bool   `json:"pad_last_batch" msgpack:"pad_last_batch"` // pad every shard to ceil(N/n) samples and whole batches
	StickToShard  bool   `json:"stick_to_shard" msgpack:"stick_to_shard"` // read the same shard every epoch
}

// diff names the fields in which s and o differ, "" when equal.
func (s Sampling) diff(o Sampling) string {
	var d []string
	add := func(name string, a, b any) {
		if a != b {
			d = append(d, fmt.Sprintf("%s %v (now %v)", name, a, b))
		}
	}
	add("dataset samples", s.N, o.N)
	add("batch_size", s.BatchSize, o.BatchSize)
	add("shard_id", s.ShardID, o.ShardID)
	add("num_shards", s.NumShards, o.NumShards)
	add("random_shuffle", s.RandomShuffle, o.RandomShuffle)
	add("seed", s.Seed, o.Seed)
	add("pad_last_batch", s.PadLastBatch, o.PadLastBatch)
	add("stick_to_shard", s.StickToShard, o.StickToShard)
	return strings.Join(d, ", ")
}

// ShardRange returns shard k's half-open range of positions in the epoch
// order.
func (s Sampling) ShardRange(k int) (lo, hi int) {
	return k * s.N / s.NumShards, (k + 1) * s.N / s.NumShards
}

// Shard returns the shard this rank reads in epoch e.
func (s Sampling) Shard(epoch int) int {
	if s.StickToShard {
		return s.ShardID
	}
	return (s.ShardID + epoch) % s.NumShards
}

// EpochSamples returns how many samples (padding included) this rank reads
// in epoch e.
func (s Sampling) EpochSamples(epoch int) int {
	if s.PadLastBatch {
		per := (s.N + s.NumShards - 1) / s.NumShards
		return (per + s.BatchSize - 1) / s.BatchSize * s.BatchSize
	}
	lo, hi := s.ShardRange(s.Shard(epoch))
	return hi - lo
}

// EpochBatches returns how many batches this rank reads in epoch e.
func (s Sampling) EpochBatches(epoch int) int {
	return (s.EpochSamples(epoch) + s.BatchSize - 1) / s.BatchSize
}

// EpochOrder writes this rank's sample indices for epoch e into buf (which
// it grows as needed) and returns them, padding included. perm is scratch
// for the permutation (length N when RandomShuffle).
func (s Sampling) EpochOrder(epoch int, buf, perm []int32) (order, permOut []int32) {
	lo, hi := s.ShardRange(s.Shard(epoch))
	n := s.EpochSamples(epoch)
	order = grow(buf, n)
	if s.RandomShuffle {
		perm = Permutation(s.Seed, epoch, s.N, perm)
		copy(order, perm[lo:hi])
	} else {
		for i := lo; i < hi; i++ {
			order[i-lo] = int32(i)
		}
	}
	for i := hi - lo; i < n; i++ {
		order[i] = order[hi-lo-1]
	}
	return order, perm
}

func grow(b []int32, n int) []int32 {
	if cap(b) < n {
		return make([]int32, n)
	}
	return b[:n]
}

// Permutation returns a uniformly random permutation of [0, n) determined
// by (seed, epoch) alone, written into buf. It uses its own Fisher-Yates
// over PCG with Lemire's bounded draw, so the sequence does not depend on
// the Go version's rand.Shuffle.
func Permutation(seed uint64, epoch, n int, buf []int32) []int32 {
	p := grow(buf, n)
	for i := range p {
		p[i] = int32(i)
	}
	src := rand.NewPCG(seed, uint64(epoch)^0x9E3779B97F4A7C15)
	for i := n - 1; i > 0; i-- {
		j := int(bounded(src, uint64(i+1)))
		p[i], p[j] = p[j], p[i]
	}
	return p
}

// bounded draws uniformly from [0, n) (Lemire's nearly-divisionless method).
func bounded(src *rand.PCG, n uint64) uint64 {
	hi, lo := bits.Mul64(src.Uint64(), n)
	if lo < n {
		thresh := -n % n
		for lo < thresh {
			hi, lo = bits.Mul64(src.Uint64(), n)
		}
	}
	return hi
}
