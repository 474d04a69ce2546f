// SPDX-License-Identifier: Apache-2.0

// Package daliorder reproduces the order in which DALI's fn.readers.file
// returns samples, epoch by epoch, for one shard: the same sample indices
// in the same order as the real reader (DALI's Loader and
// FileLabelLoader, checked against DALI 2.4), with random_shuffle on or
// off, any initial_fill, seed, num_shards, shard_id, pad_last_batch and
// stick_to_shard.
//
// What the reader does, in terms of sample indices (positions in the
// file list as DALI lists it):
//
//  1. With random_shuffle the file list is first permuted once, the same
//     on every rank and for every seed: std::shuffle with
//     std::mt19937(524287) (FileOrder). Shard k is the range
//     [floor(k·N/n), floor((k+1)·N/n)) of that list.
//  2. The reader reads the list in order from its shard's start. Without
//     stick_to_shard it reads on past the shard's end into the next one,
//     wrapping from the end of the list to its start, so epoch e's
//     samples are shard (k+e) mod n; with stick_to_shard it goes back to
//     its shard's start each time it reaches the end: every epoch has the
//     same samples.
//  3. Samples pass through a buffer of initial_fill samples (1 without
//     random_shuffle), filled at the first read; each returned sample is
//     replaced by the next one read. The buffer remembers which epoch
//     each sample it holds belongs to; a sample is drawn uniformly from
//     those of the current epoch (std::uniform_int_distribution<int> over
//     their count, one draw per sample, even when only one is left) with
//     std::minstd_rand0 (libstdc++'s std::default_random_engine) seeded
//     through std::seed_seq{seed}, whose words are 32 bits: seeds that
//     differ above bit 31 draw alike. An epoch is therefore a permutation
//     of its shard in which a sample comes out at most initial_fill-1
//     places before it was read, and after it by a geometric tail (each
//     draw takes it with probability 1/initial_fill); it never mixes
//     epochs; the generator and the buffer run on from one epoch into the
//     next.
//  4. When the epoch's samples are all returned: without pad_last_batch
//     the next sample begins the next epoch, even inside a batch (DALI's
//     batches then straddle epochs; here an epoch is its own samples and
//     its last batch is partial). With pad_last_batch the last sample
//     returned repeats, without reading or drawing, until the epoch has
//     ceil(N/n) samples and ends a whole batch.
//
// With shuffle_after_epoch (not with random_shuffle or stick_to_shard,
// which DALI refuses alongside it) the reader behaves as with
// stick_to_shard and no random_shuffle (a buffer of one, no draws), but
// its whole list is permuted again each time a shard's last sample is
// read, before the next epoch's first: std::shuffle with
// std::mt19937_64(shuffle_after_epoch_seed + k·2^32) at the k-th time
// (k = 1 before the first read; the seed defaults to FileListSeed), of
// the list as the previous shuffle left it (DALI keeps no copy of the
// original order unless the pipeline enables checkpointing, which then
// shuffles the original order each time: not reproduced here). That is
// DALI 2.4's FileLoader and FileLabelLoader Reset, read from its
// libdali_operators.so and checked against its output. The reader's seed
// plays no part: every rank draws the same lists, so the shards of an
// epoch are disjoint, and two readers of lists of the same length read the
// same positions: paired datasets stay paired.
//
// How the reader is driven (prefetch depth, read_ahead, the pipeline's
// threads, lazy_init) changes when samples are read, never which or in
// what order. Epoch e's order depends on every epoch before it (the buffer
// and the generator carry over), so getting to epoch e replays epochs
// 0..e-1: about 15 ns a sample with the default initial_fill (an epoch's
// padding costs nothing; a buffer far larger than the CPU's caches costs
// up to ten times more), and Skip can be stopped part-way.
package daliorder

import "github.com/nvfeed/nvfeed/internal/stdrand"

// FileListSeed is the fixed seed of the std::mt19937 that permutes the
// file list once when random_shuffle is set (DALI's kDaliDataloaderSeed),
// and shuffle_after_epoch_seed's default.
const FileListSeed = 524287

// Params are the reader's arguments, with fn.readers.file's names.
type Params struct {
	N             int    // files in the list, >= NumShards
	BatchSize     int    // the pipeline's batch size, >= 1
	ShardID       int    // in [0, NumShards)
	NumShards     int    // >= 1
	RandomShuffle bool   // random_shuffle
	InitialFill   int    // initial_fill, >= 1 (used with RandomShuffle only)
	Seed          uint64 // seed; its low 32 bits count
	PadLastBatch  bool   // pad_last_batch
	StickToShard  bool   // stick_to_shard
	// ShuffleAfterEpoch is shuffle_after_epoch: the list permuted anew
	// every epoch, the same on every rank. Not with RandomShuffle or
	// StickToShard (it implies the latter).
	ShuffleAfterEpoch bool
	// ListOrder keeps the list's order under RandomShuffle: step 1
	// above is fn.readers.file's, which fn.readers.webdataset's loader
	// does not take (its samples are read in shard and member order and
	// shuffled by the buffer alone).
	ListOrder bool
	// ShuffleAfterEpochSeed is shuffle_after_epoch_seed (DALI's default
	// is FileListSeed: pass it where the pipeline gives none).
	ShuffleAfterEpochSeed uint64
}

// FileOrder returns the file list's order under random_shuffle: entry i
// is the index of the file read i-th, std::shuffle of [0, n) with
// std::mt19937(FileListSeed). It writes into buf when it is large enough.
func FileOrder(n int, buf []int32) []int32 {
	p := buf[:0]
	if cap(p) < n {
		p = make([]int32, n)
	}
	p = p[:n]
	for i := range p {
		p[i] = int32(i)
	}
	stdrand.Shuffle(p, stdrand.NewMT19937(FileListSeed))
	return p
}

// Reader is one rank's reader. Its zero value is not usable: see New.
// Not safe for concurrent use.
//
// It holds its list and its buffer, nothing that grows with the epochs
// the buffer spans (an initial_fill far larger than a shard holds samples
// of many epochs): where each epoch's reads begin and end follows from
// the shards' lengths, so only the epoch being returned is tracked.
type Reader struct {
	p    Params
	list []int32 // the file list's order; nil: the identity
	// shuffles counts the list's shuffles with ShuffleAfterEpoch: the
	// next one is shuffle shuffles+1 (see reshuffle).
	shuffles uint32
	rng      stdrand.MinstdRand0
	ring     []int32 // the buffer: read position i is in slot i mod len(ring)

	// The epoch being returned holds read positions [start, end): start
	// is its next sample to return, end the position just past its last
	// read (some may not be read yet: read is the next read position);
	// shard is the shard it reads.
	start, end, read int64
	shard            int
	cur              int   // the next list position to read
	returned         int   // samples (padding included) returned in the current epoch
	last             int32 // the last sample returned
	epoch            int   // the epoch Next returns next
	started          bool  // the buffer is filled
	steps            int   // samples and epoch ends gone through, for Skip's looks at stop
}

// Bytes returns the memory a Reader for p holds: its file list (N
// int32s, with RandomShuffle unless ListOrder) and its buffer (InitialFill int32s, 1
// without RandomShuffle). Nothing else it holds grows with p.
func Bytes(p Params) int64 {
	if p.ShuffleAfterEpoch {
		return 4 * (int64(p.N) + 1)
	}
	if !p.RandomShuffle {
		return 4
	}
	if p.ListOrder {
		return 4 * int64(max(p.InitialFill, 1))
	}
	return 4 * (int64(p.N) + int64(max(p.InitialFill, 1)))
}

// New returns a reader at the start of epoch 0. p must be valid: N >=
// NumShards >= 1, ShardID in range, BatchSize >= 1, InitialFill >= 1
// when RandomShuffle, and not ShuffleAfterEpoch with RandomShuffle or
// StickToShard.
func New(p Params) *Reader {
	fill := 1
	var list []int32
	switch {
	case p.RandomShuffle:
		fill = p.InitialFill
		if !p.ListOrder {
			list = FileOrder(p.N, nil)
		}
	case p.ShuffleAfterEpoch:
		p.StickToShard = true // as DALI sets it
		list = make([]int32, p.N)
		for i := range list {
			list[i] = int32(i)
		}
	}
	r := &Reader{
		p:     p,
		list:  list,
		rng:   stdrand.NewMinstdRand0Seq(stdrand.SeedSeq{uint32(p.Seed)}),
		ring:  make([]int32, fill),
		cur:   start(p.ShardID, p.NumShards, p.N),
		shard: p.ShardID,
		end:   int64(shardLen(p.ShardID, p.NumShards, p.N)),
	}
	if p.ShuffleAfterEpoch {
		r.reshuffle() // DALI's first reset, before the first read
	}
	return r
}

// reshuffle permutes the list as DALI's k-th reset does with
// shuffle_after_epoch: std::shuffle with std::mt19937_64 seeded with
// shuffle_after_epoch_seed + k·2^32 (DALI adds its epoch counter, an int
// incremented at each reset, shifted 32 bits up).
func (r *Reader) reshuffle() {
	r.shuffles++
	stdrand.Shuffle(r.list, stdrand.NewMT64(r.p.ShuffleAfterEpochSeed+uint64(r.shuffles)<<32))
}

// start returns shard k's first list position.
func start(k, n, size int) int { return k * size / n }

// shardLen returns shard k's length: the reads of an epoch that reads it.
func shardLen(k, n, size int) int { return start(k+1, n, size) - start(k, n, size) }

// stopEvery is how many samples (and epoch ends) a skip takes between
// looks at its stop channel, over epochs: about a millisecond.
const stopEvery = 1 << 16

// Epoch returns the epoch the next Next call returns.
func (r *Reader) Epoch() int { return r.epoch }

// Next returns the samples of epoch Epoch(), padding included, written
// into buf (grown as needed), and moves on to the next epoch.
func (r *Reader) Next(buf []int32) []int32 {
	out, _ := r.run(buf[:0], true, nil)
	return out
}

// Skip moves on to the next epoch without returning its samples: it costs
// the epoch's own samples, never its padding. It gives up when stop is
// closed (looked at every stopEvery samples; nil: never), returning
// false: the reader is then in the middle of the epoch and of no further
// use.
func (r *Reader) Skip(stop <-chan struct{}) bool {
	_, ok := r.run(nil, false, stop)
	return ok
}

func (r *Reader) run(out []int32, keep bool, stop <-chan struct{}) ([]int32, bool) {
	if !r.started {
		for i := range r.ring {
			r.ring[i] = r.readOne() // read position i
		}
		r.started = true
	}
	p := r.p
	per := (p.N + p.NumShards - 1) / p.NumShards // every shard's length with padding
	size := int64(len(r.ring))
	select {
	case <-stop: // a skip asked to stop before it began takes no step (nil: never)
		return out, false
	default:
	}
	for {
		if r.steps++; stop != nil && r.steps%stopEvery == 0 {
			select {
			case <-stop:
				return out, false
			default:
			}
		}
		if r.start == r.end { // the epoch's samples are all out
			if p.PadLastBatch {
				// The last sample repeats, without reading or drawing, up
				// to ceil(N/n) samples and a whole batch.
				padded := (max(r.returned, per) + p.BatchSize - 1) / p.BatchSize * p.BatchSize
				if keep {
					for range padded - r.returned {
						out = append(out, r.last)
					}
				}
			}
			r.returned = 0
			r.epoch++
			if !p.StickToShard {
				r.shard = (r.shard + 1) % p.NumShards
			}
			r.end += int64(shardLen(r.shard, p.NumShards, p.N))
			return out, true
		}
		var off int64
		if p.RandomShuffle {
			// Drawn among the epoch's samples in the buffer: those read.
			off = int64(stdrand.UniformInt(&r.rng, 0, uint64(min(r.end, r.read)-r.start-1)))
		}
		i, j := (r.start+off)%size, r.start%size
		r.ring[i], r.ring[j] = r.ring[j], r.ring[i]
		s := r.ring[j]
		r.ring[j] = r.readOne() // into read position r.start+size: slot j
		r.start++
		if keep {
			out = append(out, s)
		}
		r.returned++
		r.last = s
	}
}

// readOne reads the next sample of the list.
func (r *Reader) readOne() int32 {
	p := r.p
	s := int32(r.cur)
	if r.list != nil {
		s = r.list[r.cur]
	}
	r.cur++
	// At the end of the list, or of the shard with stick_to_shard, go
	// back to the start of the list or of the shard.
	if r.cur >= p.N || (p.StickToShard && p.ShardID+1 < p.NumShards && r.cur >= start(p.ShardID+1, p.NumShards, p.N)) {
		if p.StickToShard {
			r.cur = start(p.ShardID, p.NumShards, p.N)
		} else {
			r.cur = 0
		}
		if p.ShuffleAfterEpoch {
			r.reshuffle()
		}
	}
	r.read++
	return s
}
