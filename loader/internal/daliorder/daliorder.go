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
// How the reader is driven (prefetch depth, read_ahead, the pipeline's
// threads, lazy_init) changes when samples are read, never which or in
// what order. Epoch e's order depends on every epoch before it (the buffer
// and the generator carry over), so getting to epoch e replays epochs
// 0..e-1: about 15 ns a sample.
package daliorder

import "github.com/nvfeed/nvfeed/internal/stdrand"

// FileListSeed is the fixed seed of the std::mt19937 that permutes the
// file list once when random_shuffle is set (DALI's kDaliDataloaderSeed).
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

// span is an epoch's samples in the buffer: read positions [start, end).
type span struct{ start, end int64 }

// Reader is one rank's reader. Its zero value is not usable: see New.
// Not safe for concurrent use.
type Reader struct {
	p    Params
	list []int32 // the file list's order; nil: the identity
	rng  stdrand.MinstdRand0
	ring []int32 // the buffer: read position i is in slot i mod len(ring)

	// spans are the epochs in the buffer, oldest first (spans[0] is the
	// epoch being returned); together they cover the buffer.
	spans []span
	read  int64 // samples read so far: the next read position
	// The read side: cur is the next list position to read; the reads
	// of the epoch being read began at shard vshard's start, cnt of them
	// made.
	cur, vshard, cnt int
	returned         int   // samples (padding included) returned in the current epoch
	last             int32 // the last sample returned
	epoch            int   // the epoch Next returns next
	started          bool  // the buffer is filled
}

// New returns a reader at the start of epoch 0. p must be valid: N >=
// NumShards >= 1, ShardID in range, BatchSize >= 1, and InitialFill >= 1
// when RandomShuffle.
func New(p Params) *Reader {
	fill := 1
	var list []int32
	if p.RandomShuffle {
		fill = p.InitialFill
		list = FileOrder(p.N, nil)
	}
	return &Reader{
		p:      p,
		list:   list,
		rng:    stdrand.NewMinstdRand0Seq(stdrand.SeedSeq{uint32(p.Seed)}),
		ring:   make([]int32, fill),
		cur:    start(p.ShardID, p.NumShards, p.N),
		vshard: p.ShardID,
	}
}

// start returns shard k's first list position.
func start(k, n, size int) int { return k * size / n }

// Epoch returns the epoch the next Next call returns.
func (r *Reader) Epoch() int { return r.epoch }

// Next returns the samples of epoch Epoch(), padding included, written
// into buf (grown as needed), and moves on to the next epoch.
func (r *Reader) Next(buf []int32) []int32 {
	return r.run(buf[:0], true)
}

// Skip moves on to the next epoch without returning its samples.
func (r *Reader) Skip() { r.run(nil, false) }

func (r *Reader) run(out []int32, keep bool) []int32 {
	if !r.started {
		r.spans = append(r.spans, span{})
		for i := range r.ring {
			r.ring[i] = r.readOne() // read position i
		}
		r.started = true
	}
	p := r.p
	per := (p.N + p.NumShards - 1) / p.NumShards // every shard's length with padding
	size := int64(len(r.ring))
	for {
		f := r.spans[0]
		if f.start == f.end { // the epoch's samples are all out
			if p.PadLastBatch && (r.returned < per || r.returned%p.BatchSize != 0) {
				if keep {
					out = append(out, r.last)
				}
				r.returned++
				continue
			}
			r.spans = r.spans[1:]
			r.returned = 0
			r.epoch++
			return out
		}
		var off int64
		if p.RandomShuffle {
			off = int64(stdrand.UniformInt(&r.rng, 0, uint64(f.end-f.start-1)))
		}
		i, j := (f.start+off)%size, f.start%size
		r.ring[i], r.ring[j] = r.ring[j], r.ring[i]
		s := r.ring[j]
		r.ring[j] = r.readOne() // into read position f.start+size: slot j
		r.spans[0].start++
		if keep {
			out = append(out, s)
		}
		r.returned++
		r.last = s
	}
}

// readOne reads the next sample of the list and counts it in its epoch's
// span (a new span when it begins the next epoch).
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
			r.cur = start(r.vshard, p.NumShards, p.N)
		} else {
			r.cur = 0
		}
	}
	// The sample just read is the cnt-th of the epoch being read; past
	// its shard's end it is the first of the next epoch.
	r.cnt++
	at := r.cnt - 1 + start(r.vshard, p.NumShards, p.N)
	if at >= p.N || (r.vshard+1 < p.NumShards && at >= start(r.vshard+1, p.NumShards, p.N)) {
		if !p.StickToShard {
			r.vshard = (r.vshard + 1) % p.NumShards
		}
		r.cnt = 1
		r.spans = append(r.spans, span{r.read, r.read})
	}
	r.spans[len(r.spans)-1].end++
	r.read++
	return s
}
