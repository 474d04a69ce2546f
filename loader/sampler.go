// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"fmt"
	"github.com/nvfeed/nvfeed/bmap"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/nvfeed/nvfeed/loader/internal/daliorder"
	"github.com/nvfeed/nvfeed/loader/internal/permute"
	"github.com/nvfeed/nvfeed/loader/internal/wdsorder"
)

// Sampling is the part of the options that decides which samples a rank
// reads in which order. It is pure: the same Sampling gives the same
// sequence in every process.
//
// Sharding follows DALI's fn.readers.file: shard k of n is the range
// [floor(k·N/n), floor((k+1)·N/n)) of the epoch's list of samples; in
// epoch e a rank reads shard (k+e) mod n, or shard k every epoch with
// StickToShard. With PadLastBatch every shard yields ceil(N/n) samples
// (its last sample repeats), padded further to whole batches; without it
// the shard's last batch is partial. Without RandomShuffle the list is the
// samples in order, and the sequence is fn.readers.file's.
//
// RandomShuffle shuffles in one of two ways, by Shuffle:
//
//   - ShufflePermute (the default) draws a full permutation of all N
//     samples per epoch from (Seed, epoch), the same on every rank, and
//     the shards are ranges of it: ranks stay disjoint within an epoch and
//     every epoch's order is independent of the others (global mixing).
//     The permutation is computed (package permute), never stored: a
//     loader holds O(1) memory for its order whatever N, and a batch's
//     samples are a function of (Seed, epoch, batch) alone. A file
//     dataset resumed from a state of version ListedVersion or less lists
//     it instead (Permutation, 4·N bytes; see StateVersion).
//     With StickToShard a rank reads, every epoch, the samples DALI's
//     shard k holds (a range of its fixed list order, below), permuted
//     anew each epoch from (Seed, epoch) by Permutation: a node that
//     caches its shard keeps it.
//   - ShuffleDALI gives fn.readers.file(random_shuffle=True)'s order
//     sample for sample (package loader/internal/daliorder): DALI permutes
//     the list once, with a fixed seed (the same order for every Seed and
//     epoch), then passes each epoch's shard through a buffer of
//     InitialFill samples from which a generator seeded with Seed draws.
//     That shuffle is local: in every epoch a sample comes out at most
//     InitialFill-1 places before its position in its shard of the one
//     fixed order, and after it by a geometric tail (each draw takes it
//     with probability 1/InitialFill: a few InitialFill places for nearly
//     every sample), so neighbours there meet in batches epoch after
//     epoch. An epoch's order
//     depends on the epochs before it; starting at epoch e (a resumed
//     State, a seek) replays them: about 15 ns a sample, at most
//     MaxReplaySamples.
//
// WebDataset sampling (a webdataset map's, set by the loader for
// Options.WebDataset) keeps the list in shard and member order, as
// fn.readers.webdataset does (no fixed file-list shuffle). With
// StickToShard its shard is a range of that list, permuted anew each
// epoch by permute. ShuffleDALI is fn.readers.webdataset's order
// (package wdsorder).
type Sampling struct {
	N          int `json:"n" msgpack:"n"` // samples in the dataset
	ReaderArgs `msgpack:",inline"`
	// WebDataset: the samples are a webdataset map's (see above).
	WebDataset bool `json:"webdataset,omitempty" msgpack:"webdataset,omitempty"`
	// resume is the resumed epoch (Resumed), nil without one.
	resume *resumed
	// listed: a file dataset's ShufflePermute is Permutation's listed
	// order, as in states of version ListedVersion or less.
	listed bool
}

// The ways RandomShuffle shuffles (ReaderArgs.Shuffle).
const (
	// ShufflePermute draws a full permutation of the dataset every epoch
	// (the default; "" means it too).
	ShufflePermute = "permute"
	// ShuffleDALI reproduces fn.readers.file's order exactly: its fixed
	// list shuffle and its initial_fill buffer.
	ShuffleDALI = "dali"
)

// ReaderArgs are the sampling arguments of DALI's fn.readers.file, with
// its names: one type from the wire (the daemon's open request) through
// the session to Options and Sampling.
type ReaderArgs struct {
	BatchSize     int    `json:"batch_size" msgpack:"batch_size"`         // samples per batch
	ShardID       int    `json:"shard_id" msgpack:"shard_id"`             // this rank, in [0, NumShards)
	NumShards     int    `json:"num_shards" msgpack:"num_shards"`         // ranks; 0 means 1 in Options
	RandomShuffle bool   `json:"random_shuffle" msgpack:"random_shuffle"` // shuffle every epoch, as Shuffle says
	Seed          uint64 `json:"seed" msgpack:"seed"`                     // the shuffle's seed (ShuffleDALI: its low 32 bits, as DALI's)
	PadLastBatch  bool   `json:"pad_last_batch" msgpack:"pad_last_batch"` // pad every shard to ceil(N/n) samples and whole batches
	StickToShard  bool   `json:"stick_to_shard" msgpack:"stick_to_shard"` // read the same shard every epoch
	// Shuffle is how RandomShuffle shuffles: ShufflePermute ("" too) or
	// ShuffleDALI. Not a DALI argument.
	Shuffle string `json:"shuffle" msgpack:"shuffle"`
	// InitialFill is fn.readers.file's shuffle buffer, in samples, in
	// [1, MaxInitialFill]; 0 means DefaultInitialFill. Only ShuffleDALI
	// with RandomShuffle uses it.
	InitialFill int `json:"initial_fill" msgpack:"initial_fill"`
	// ShuffleAfterEpoch is shuffle_after_epoch: the whole list permuted
	// anew at every epoch's end, the same permutations on every rank and
	// for every seed (DALI 2.4's order: std::shuffle with
	// std::mt19937_64 of ShuffleAfterEpochSeed plus the epoch's count
	// shifted 32 bits up, daliorder.Params.ShuffleAfterEpoch), each rank
	// reading its shard_id's range of it. Two sessions over datasets of
	// the same length read the same positions: paired datasets stay
	// paired. Not with RandomShuffle or StickToShard (DALI refuses them
	// together); it implies StickToShard's shard.
	ShuffleAfterEpoch bool `json:"shuffle_after_epoch" msgpack:"shuffle_after_epoch"`
	// ShuffleAfterEpochSeed is shuffle_after_epoch_seed, DALI's int64
	// (nil: DALI's default, DefaultShuffleAfterEpochSeed). Only
	// ShuffleAfterEpoch uses it; every rank of a job must pass the same.
	ShuffleAfterEpochSeed *int64 `json:"shuffle_after_epoch_seed,omitempty" msgpack:"shuffle_after_epoch_seed,omitempty"`
}

// DefaultShuffleAfterEpochSeed is shuffle_after_epoch_seed where none is
// given, as in DALI.
const DefaultShuffleAfterEpochSeed = daliorder.FileListSeed

// AfterEpochSeed returns the shuffle_after_epoch_seed in effect: the one
// given, or DefaultShuffleAfterEpochSeed.
func (a ReaderArgs) AfterEpochSeed() int64 {
	if a.ShuffleAfterEpochSeed == nil {
		return DefaultShuffleAfterEpochSeed
	}
	return *a.ShuffleAfterEpochSeed
}

// withDefaults fills in the zero fields that have defaults: NumShards,
// Shuffle and InitialFill.
func (a ReaderArgs) withDefaults() ReaderArgs {
	if a.NumShards == 0 {
		a.NumShards = 1
	}
	if a.Shuffle == "" {
		a.Shuffle = ShufflePermute
	}
	if a.InitialFill == 0 {
		a.InitialFill = DefaultInitialFill
	}
	return a
}

// daliShuffled reports whether the order is DALI's buffer shuffle (which
// depends on the epochs before: seeks replay).
func (s Sampling) daliShuffled() bool {
	return (s.RandomShuffle && s.Shuffle == ShuffleDALI) || s.ShuffleAfterEpoch
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
	add("shuffle", s.Shuffle, o.Shuffle)
	add("initial_fill", s.InitialFill, o.InitialFill)
	add("shuffle_after_epoch", s.ShuffleAfterEpoch, o.ShuffleAfterEpoch)
	if s.ShuffleAfterEpoch && o.ShuffleAfterEpoch {
		add("shuffle_after_epoch_seed", s.AfterEpochSeed(), o.AfterEpochSeed())
	}
	add("webdataset", s.WebDataset, o.WebDataset)
	return strings.Join(d, ", ")
}

// ShardRange returns shard k's half-open range of positions in the epoch
// order.
func (s Sampling) ShardRange(k int) (lo, hi int) {
	return s.shardIn(s.N, k)
}

// shardIn returns shard k's range of a list of n.
func (s Sampling) shardIn(n, k int) (lo, hi int) {
	return k * n / s.NumShards, (k + 1) * n / s.NumShards
}

// epochShard returns the range of epoch e's list this rank reads.
func (s Sampling) epochShard(epoch int) (lo, hi int) {
	return s.shardIn(s.epochLen(epoch), s.Shard(epoch))
}

// Shard returns the shard this rank reads in epoch e.
func (s Sampling) Shard(epoch int) int {
	if s.StickToShard || s.ShuffleAfterEpoch {
		return s.ShardID
	}
	return (s.ShardID + epoch) % s.NumShards
}

// EpochSamples returns how many samples (padding included) this rank reads
// in epoch e.
func (s Sampling) EpochSamples(epoch int) int {
	if s.PadLastBatch {
		per := (s.epochLen(epoch) + s.NumShards - 1) / s.NumShards
		return (per + s.BatchSize - 1) / s.BatchSize * s.BatchSize
	}
	lo, hi := s.epochShard(epoch)
	return hi - lo
}

// EpochBatches returns how many batches this rank reads in epoch e.
func (s Sampling) EpochBatches(epoch int) int {
	return (s.EpochSamples(epoch) + s.BatchSize - 1) / s.BatchSize
}

// EpochOrder writes this rank's sample indices for epoch e into buf (which
// it grows as needed) and returns them, padding included. perm is scratch
// for the permutation (length N when RandomShuffle). Each call starts
// afresh: with ShuffleDALI it replays the epochs before e; a caller that
// goes through epochs in turn uses Orders.
func (s Sampling) EpochOrder(epoch int, buf, perm []int32) (order, permOut []int32) {
	o := s.Orders()
	o.perm = perm
	order = o.Epoch(epoch, buf)
	return order, o.perm
}

// SamplerBytes returns the memory a loader over s holds for its sample
// order, besides its batch memory. A computed order holds one batch's
// indices. A listed one holds the epoch's order (the longest epoch's
// samples, padding included), and as s shuffles, the listed permutation
// of all N samples (a state of version ListedVersion or less), the
// shard's samples and their permutation (with StickToShard, and the file
// list while it is sorted out), or DALI's reader (its file list of N
// samples and its initial_fill buffer, daliorder.Bytes). A daemon admits
// it against its budget before opening (s as NewPlan resumed it). All
// are int32s.
func SamplerBytes(s Sampling) int64 {
	s.ReaderArgs = s.ReaderArgs.withDefaults()
	// The longest epoch: a shard's ceil(N/num_shards) samples, padded to
	// whole batches with PadLastBatch.
	shards, b := int64(max(s.NumShards, 1)), int64(max(s.BatchSize, 1))
	longest := (int64(s.N) + shards - 1) / shards
	if s.PadLastBatch {
		longest = (longest + b - 1) / b * b
	}
	order := 4 * longest
	switch {
	case s.computed():
		return 4 * b // one batch's indices
	case s.WebDataset && s.daliShuffled():
		return order + wdsorder.Bytes(daliorder.Params{N: s.N, RandomShuffle: true, InitialFill: s.InitialFill})
	case s.ShuffleAfterEpoch:
		return order + daliorder.Bytes(daliorder.Params{N: s.N, ShuffleAfterEpoch: true})
	case s.daliShuffled():
		return order + daliorder.Bytes(daliorder.Params{N: s.N, RandomShuffle: true, InitialFill: s.InitialFill})
	case s.RandomShuffle && s.StickToShard:
		return order + 4*int64(s.N) + 8*longest
	case s.RandomShuffle:
		return order + 4*int64(s.N)
	}
	return order
}

// Orders gives a rank's epoch orders, EpochOrder's sequence, keeping what
// the next epoch needs: the permutation's scratch, a StickToShard shard's
// samples, DALI's reader. Not safe for concurrent use.
type Orders struct {
	s    Sampling
	perm []int32           // ShufflePermute: the permutation
	set  []int32           // ShufflePermute with StickToShard: the shard's samples, sorted
	dali *daliorder.Reader // ShuffleDALI: the reader, at its next epoch
}

// Orders returns an Orders for s, at epoch 0.
func (s Sampling) Orders() *Orders { return &Orders{s: s} }

// Epoch writes epoch e's sample indices into buf (grown as needed) and
// returns them, padding included. Epochs asked for in turn cost their own
// samples; with ShuffleDALI an earlier epoch than the last one asked for,
// or a later one than the next, replays the epochs before it.
func (o *Orders) Epoch(epoch int, buf []int32) []int32 {
	order, _ := o.epoch(epoch, buf, nil)
	return order
}

// replays reports whether Epoch(epoch) would do more than go through
// epoch's own samples: with ShuffleDALI, start a reader (its file list,
// N samples, and its buffer, up to MaxInitialFill: at open and after
// every seek) or replay the epochs before epoch.
func (o *Orders) replays(epoch int) bool {
	return o.s.daliShuffled() && (o.dali == nil || o.dali.Epoch() != epoch)
}

// epoch is Epoch, giving up a replay when stop is closed (nil: never):
// then it returns false, and the next call starts afresh.
func (o *Orders) epoch(epoch int, buf []int32, stop <-chan struct{}) ([]int32, bool) {
	s := o.s
	lo, hi := s.epochShard(epoch)
	n := s.EpochSamples(epoch)
	order := grow(buf, n)
	if s.resume != nil && s.resume.epoch == epoch { // checkStages: not daliShuffled, not StickToShard
		var pm permute.Perm
		switch {
		case s.RandomShuffle && s.computed():
			pm = permute.New(uint64(s.N), s.Seed, uint64(epoch))
		case s.RandomShuffle:
			o.perm = Permutation(s.Seed, epoch, s.N, o.perm)
		}
		q := 0
		s.spans(epoch, lo, hi, func(p, m int) {
			for i := range m {
				order[q+i] = s.sampleAt(p+i, o.perm, pm)
			}
			q += m
		})
		for ; q < n; q++ {
			order[q] = s.resumedAt(epoch, lo, hi, q, o.perm, pm)
		}
		return order, true
	}
	switch {
	case s.daliShuffled():
		if o.dali == nil || o.dali.Epoch() > epoch {
			p := daliorder.Params{N: s.N, BatchSize: s.BatchSize, ShardID: s.ShardID,
				NumShards: s.NumShards, RandomShuffle: s.RandomShuffle, InitialFill: s.InitialFill, Seed: s.Seed,
				PadLastBatch: s.PadLastBatch, StickToShard: s.StickToShard, ShuffleAfterEpoch: s.ShuffleAfterEpoch,
				ShuffleAfterEpochSeed: uint64(s.AfterEpochSeed())} // DALI's int64, two's complement
			if s.WebDataset {
				o.dali = wdsorder.New(p)
			} else {
				o.dali = daliorder.New(p)
			}
		}
		for o.dali.Epoch() < epoch {
			if !o.dali.Skip(stop) {
				o.dali = nil // part-way through an epoch
				return order[:0], false
			}
		}
		return o.dali.Next(order[:0]), true
	case s.computed():
		for b := 0; b*s.BatchSize < n; b++ {
			s.batchAt(epoch, b, order[b*s.BatchSize:b*s.BatchSize])
		}
		return order, true
	case s.RandomShuffle && s.StickToShard:
		// DALI's shard k, the same samples every epoch, in a fresh order.
		if o.set == nil {
			o.set = daliorder.FileOrder(s.N, nil)[lo:hi]
			slices.Sort(o.set)
		}
		o.perm = Permutation(s.Seed, epoch, hi-lo, o.perm)
		for i, j := range o.perm {
			order[i] = o.set[j]
		}
	case s.RandomShuffle:
		o.perm = Permutation(s.Seed, epoch, s.N, o.perm)
		copy(order, o.perm[lo:hi])
	default:
		for i := lo; i < hi; i++ {
			order[i-lo] = int32(i)
		}
	}
	for i := hi - lo; i < n; i++ {
		order[i] = order[hi-lo-1]
	}
	return order, true
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
// the Go version's rand.Shuffle. It is the listed order: StickToShard's
// shard, and ShufflePermute resumed from a state of version
// ListedVersion or less.
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

// computed reports whether the order is computed batch by batch
// (batchAt) rather than listed per epoch. It is, but for ShuffleDALI's
// and shuffle_after_epoch's orders and for two of a file dataset's:
// random_shuffle with stick_to_shard (DALI's shard, listed) and a
// ShufflePermute resumed from a state of version 3 or less (listed).
func (s Sampling) computed() bool {
	switch {
	case s.daliShuffled():
		return false
	case s.WebDataset, !s.RandomShuffle:
		return true
	}
	return !s.StickToShard && !s.listed
}

// batchAt appends batch b of epoch e's sample indices to buf (cap at
// least BatchSize for no allocation) for a computed sampling: position
// p of the epoch is the shard's p-th sample (its last one past its end:
// padding), of the list in order, of the permutation of all N samples
// for (Seed, epoch) (permute: the same on every rank, the shards its
// ranges) or, with StickToShard, of the shard's own samples permuted
// anew each epoch.
func (s Sampling) batchAt(epoch, b int, buf []int32) []int32 {
	lo, hi := s.epochShard(epoch)
	if s.resume != nil && s.resume.epoch == epoch {
		p := permute.New(uint64(s.N), s.Seed, uint64(epoch))
		for q := b * s.BatchSize; q < min((b+1)*s.BatchSize, s.EpochSamples(epoch)); q++ {
			buf = append(buf, s.resumedAt(epoch, lo, hi, q, nil, p))
		}
		return buf
	}
	from, to := b*s.BatchSize, min((b+1)*s.BatchSize, s.EpochSamples(epoch))
	var p permute.Perm
	switch {
	case s.RandomShuffle && s.StickToShard:
		p = permute.New(uint64(hi-lo), s.Seed, uint64(epoch))
	case s.RandomShuffle:
		p = permute.New(uint64(s.N), s.Seed, uint64(epoch))
	}
	for q := from; q < to; q++ {
		q := min(q, hi-lo-1)
		switch {
		case s.RandomShuffle && s.StickToShard:
			buf = append(buf, int32(lo+int(p.At(uint64(q)))))
		case s.RandomShuffle:
			buf = append(buf, int32(p.At(uint64(lo+q))))
		default:
			buf = append(buf, int32(lo+q))
		}
	}
	return buf
}

// Bounds on the sampling numbers a client sends (the daemon's open
// request, a resume State, a requested position). They keep every sum and
// product of the sampler's arithmetic inside int64:
//
//   - N <= MaxSamples = 2^31-1 (sample indices are int32), and
//     1 <= NumShards <= N, 0 <= ShardID < NumShards: ShardRange computes
//     (k+1)·N with k < NumShards, at most 2^31·2^31 = 2^62.
//   - EpochSamples is at most ceil(N/NumShards) rounded up to a whole
//     batch: N + MaxBatchSize < 2^32; EpochBatches is at most that.
//   - batch·BatchSize (the producer's slice of the epoch order) is at most
//     2^32·2^16 = 2^48.
//   - 0 <= Epoch <= MaxEpoch = 2^31-1: Shard computes ShardID+epoch, at
//     most 2^32; the epoch after the last one asked for (NextAt's end of
//     epoch, a resumed end of epoch) is 2^31. The producer counts epochs on
//     from there one per pass over the data: 2^63 is never reached.
//   - 0 <= Iteration <= MaxIteration = 2^31-1: it is only compared with
//     EpochBatches (a larger one asks for the end of the epoch).
//   - Seed is any uint64: it only seeds the PCG (ShuffleDALI: its low 32
//     bits seed DALI's generator).
//   - 1 <= InitialFill <= MaxInitialFill: ShuffleDALI's buffer holds that
//     many sample indices (64 MiB at most).
//   - ShuffleDALI with RandomShuffle reaches epoch e by replaying the
//     epochs before it: e·ceil(N/NumShards) <= MaxReplaySamples for a
//     resumed state or a requested position (their padding costs
//     nothing). Measured on the development VM: 22 ns a sample with the
//     default InitialFill, 56 ns with MaxInitialFill (a buffer past the
//     caches): 24 to 60 s of a core at the bound. A replay stops with its
//     producer (Close, a seek elsewhere) and runs in a turn of
//     Options.Replays. The producer goes on past it epoch by epoch,
//     replaying nothing.
const (
	MaxBatchSize = 1 << 16       // batch_size: samples per batch
	MaxSamples   = math.MaxInt32 // samples in a dataset (indices are int32); num_shards is at most the samples
	MaxEpoch     = math.MaxInt32 // epoch of a requested position or a resumed state
	MaxIteration = math.MaxInt32 // iteration (batch) of a requested position or a resumed state

	DefaultInitialFill = 1024    // initial_fill when 0: fn.readers.file's default
	MaxInitialFill     = 1 << 24 // initial_fill: ShuffleDALI's buffer, in samples
	MaxReplaySamples   = 1 << 30 // samples ShuffleDALI replays to reach a resumed or requested epoch
)

// StateVersion is the version of State's wire form. A state of another
// version is refused, but for versions 1 to 3 where their sequence is
// kept (State.Validate). Version 2 added shuffle and initial_fill, and
// made random_shuffle with stick_to_shard keep DALI's shard. Version 3
// added stages (a resume on other shards). Version 4 computes a file
// dataset's ShufflePermute permutation (package permute), as a
// webdataset's.
//
// The version selects the order. A state of version ListedVersion or
// less keeps the listed Fisher-Yates permutation (Permutation) it was
// made under, and so do the states its loader saves: a run goes on in
// one order. A fresh open computes. A loader saves the lowest version
// that reads its sequence alike (Loader.State): 4 for a file dataset's
// computed permutation, 3 with stages, else 2. An older loaderd resumes
// what it reads the same and refuses the rest.
const StateVersion = 4

// ListedVersion is the last State version whose file and numpy
// ShufflePermute order is listed (Permutation).
const ListedVersion = 3

// version returns the State version a loader over s saves at epoch
// (StateVersion says which).
func (s Sampling) version(epoch int) int {
	switch {
	case s.RandomShuffle && s.computed() && !s.WebDataset:
		return StateVersion
	case s.Stages(epoch) != nil:
		return 3 // stages
	}
	return 2
}

// State is a loader's position: the next batch Next will return. Saved
// and restored it yields exactly the remaining sequence. Its msgpack and
// JSON forms are the wire format (explicit snake_case keys).
type State struct {
	Version  int      `json:"version" msgpack:"version"`
	Sampling Sampling `json:"sampling" msgpack:"sampling"`
	Epoch    int      `json:"epoch" msgpack:"epoch"`
	Batch    int      `json:"batch" msgpack:"batch"` // next batch in Epoch; EpochBatches(Epoch) means the end-of-epoch io.EOF comes next
	// Content is the dataset's content where the state was taken.
	// The daemon fills it in and refuses a resume on a copy that differs.
	// nil: not checked.
	Content *bmap.Content `json:"content,omitempty" msgpack:"content,omitempty"`
	// Stages make Epoch a resumed epoch (see Stage); none in a state
	// of a whole epoch.
	Stages []Stage `json:"stages,omitempty" msgpack:"stages,omitempty"`
}

// resumedAt returns the sample at position q of this rank's shard [lo, hi)
// of a resumed epoch. Past the shard's end it repeats its last sample
// (padding); an empty shard pads with the list's nearest sample. The
// sample is the one at the position's origin in the epoch's full list:
// the list in order, perm (a listed permutation) or pm (the computed one).
func (s Sampling) resumedAt(epoch, lo, hi, q int, perm []int32, pm permute.Perm) int32 {
	return s.sampleAt(s.origin(epoch, min(lo+q, max(hi, lo+1)-1, s.epochLen(epoch)-1)), perm, pm)
}

// sampleAt returns the sample at position p of an epoch's full list: p
// itself in order, else perm's (listed) or pm's (computed).
func (s Sampling) sampleAt(p int, perm []int32, pm permute.Perm) int32 {
	switch {
	case !s.RandomShuffle:
		return int32(p)
	case s.computed():
		return int32(pm.At(uint64(p)))
	}
	return perm[p]
}
