// SPDX-License-Identifier: Apache-2.0

// Package daliorder reproduces the order of DALI's fn.readers.file, epoch by epoch, for one shard.
// It is checked against DALI 2.4 with every sharding and shuffling argument.
//
// What the reader does, in sample indices:
//
//  1. With random_shuffle the list is permuted once with std::mt19937(524287), the same everywhere.
//     Shard k is [floor(k·N/n), floor((k+1)·N/n)) of that list.
//  2. The reader reads on from its shard's start, into the next shards, wrapping at the end.
//     So epoch e's samples are shard (k+e) mod n. With stick_to_shard it reads its shard again.
//  3. Samples pass through a buffer of initial_fill samples, 1 without random_shuffle.
//     A sample is drawn uniformly from those of the current epoch, one draw per sample.
//     The generator is std::minstd_rand0 seeded through std::seed_seq{seed}: 32-bit words.
//     An epoch never mixes epochs; generator and buffer run on into the next one.
//  4. Without pad_last_batch the next sample begins the next epoch, even inside a batch.
//     With it the last sample repeats, without a draw, up to ceil(N/n) samples.
//
// shuffle_after_epoch behaves as stick_to_shard without random_shuffle.
// Each time a shard's last sample is read the whole list is shuffled again.
// The k-th shuffle uses std::mt19937_64(shuffle_after_epoch_seed + k·2^32) on the list as left.
// Every rank draws the same lists, so shards stay disjoint and paired datasets paired.
// DALI's checkpointing mode shuffles the original order instead; it is not reproduced.
//
// Epoch e depends on every epoch before it, so reaching it replays epochs 0..e-1.
// That costs about 15 ns a sample, and Skip can be stopped part-way.
package daliorder

import "github.com/nvfeed/nvfeed/internal/stdrand"

// FileListSeed seeds the std::mt19937 that permutes the file list under random_shuffle.
// It is DALI's kDaliDataloaderSeed and shuffle_after_epoch_seed's default.
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
	// ShuffleAfterEpoch permutes the list anew every epoch, the same on every rank.
	// Not with RandomShuffle or StickToShard.
	ShuffleAfterEpoch bool
	// ListOrder keeps the list's order under RandomShuffle, as fn.readers.webdataset does.
	ListOrder bool
	// ShuffleAfterEpochSeed defaults to FileListSeed in DALI.
	ShuffleAfterEpochSeed uint64
}

// FileOrder returns the file list's order under random_shuffle, written into buf if it fits.
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

// Reader is one rank's reader; make it with New. Not safe for concurrent use.
// It tracks only the epoch being returned: nothing grows with the epochs its buffer spans.
type Reader struct {
	p    Params
	list []int32 // the file list's order; nil: the identity
	// shuffles counts the list's shuffles with ShuffleAfterEpoch.
	shuffles uint32
	rng      stdrand.MinstdRand0
	ring     []int32 // the buffer: read position i is in slot i mod len(ring)

	// The epoch being returned holds read positions [start, end) of shard.
	// read is the next read position.
	start, end, read int64
	shard            int
	cur              int   // the next list position to read
	returned         int   // samples (padding included) returned in the current epoch
	last             int32 // the last sample returned
	epoch            int   // the epoch Next returns next
	started          bool  // the buffer is filled
	steps            int   // samples and epoch ends gone through, for Skip's looks at stop
}

// Bytes returns the memory a Reader for p holds: its file list and its buffer.
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

// New returns a reader at the start of epoch 0. p must be valid.
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

// reshuffle permutes the list as DALI's k-th reset does with shuffle_after_epoch.
// It seeds std::mt19937_64 with shuffle_after_epoch_seed + k·2^32.
func (r *Reader) reshuffle() {
	r.shuffles++
	stdrand.Shuffle(r.list, stdrand.NewMT64(r.p.ShuffleAfterEpochSeed+uint64(r.shuffles)<<32))
}

// start returns shard k's first list position.
func start(k, n, size int) int { return k * size / n }

// shardLen returns shard k's length: the reads of an epoch that reads it.
func shardLen(k, n, size int) int { return start(k+1, n, size) - start(k, n, size) }

// stopEvery is how many samples a skip takes between looks at stop: about a millisecond.
const stopEvery = 1 << 16

// Epoch returns the epoch the next Next call returns.
func (r *Reader) Epoch() int { return r.epoch }

// Next returns epoch Epoch()'s samples, padding included, in buf, and moves on.
func (r *Reader) Next(buf []int32) []int32 {
	out, _ := r.run(buf[:0], true, nil)
	return out
}

// Skip moves on to the next epoch without returning its samples; padding costs nothing.
// It returns false when stop closed first; the reader is then of no further use.
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
