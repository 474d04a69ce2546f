// SPDX-License-Identifier: Apache-2.0

package raw

import (
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/loader/backend"
)

// blockCache holds device blocks for the bam backend: a fixed arena
// outside the Go heap, split into shards each with its own index and CLOCK
// eviction. Lookups copy out under the shard lock, so an entry can never
// change under a reader.
//
// Admission: storing a block costs a copy of it and an index update, paid
// on every miss, and looking one up costs a locked index probe; both pay
// off only if blocks are asked for again before they are evicted. A
// shuffled pass over a dataset larger than the cache almost never is (hit
// rate 0.1 % over an epoch of 12 000 files with 256 MiB), and caching every
// block then made bam 1.6-1.8x slower than no cache. So once the cache is
// full, a window of admitWindow lookups with less than one hit in
// admitHitRate turns sampling on: only one block in admitSample (chosen by
// block number) is looked up and stored. The sampled blocks keep measuring
// reuse, over windows of as many blocks: a window that reaches the rate (a
// hot set, repeated epochs over data that fits) turns every block's lookup
// and storing back on. Until it is full the cache stores every block, so
// data that fits is cached whole on its first pass.
type blockCache struct {
	bs           int
	arena        []byte
	shards       []cacheShard
	hits, misses atomic.Int64
	window       atomic.Int64 // lookups in the current window
	windowHits   atomic.Int64
	all          atomic.Bool  // every block, not only sampled ones
	capacity     int64        // blocks the arena holds
	filled       atomic.Int64 // slots used so far (up to capacity)
}

const (
	admitWindow  = 1 << 12 // lookups per admission decision
	admitHitRate = 32      // a window needs 1 hit in this many lookups to cache every block
	admitSample  = 16      // while sampling, one block in this many is cached
)

type cacheShard struct {
	mu    sync.Mutex
	idx   map[uint64]int32 // block -> slot within the shard
	keys  []uint64         // slot -> block
	ref   []bool           // CLOCK reference bits
	used  int
	hand  int
	first int // first arena slot of the shard
}

const cacheShards = 64

func newBlockCache(bytes int64, bs int) (*blockCache, error) {
	n := int(bytes / int64(bs))
	per := n / cacheShards
	if per < 1 {
		return nil, fmt.Errorf("%w: cache of %d bytes holds less than one %d-byte block per shard (%d shards)", backend.ErrOptions, bytes, bs, cacheShards)
	}
	arena, err := unix.Mmap(-1, 0, per*cacheShards*bs, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("raw: block cache of %d bytes: %w", bytes, err)
	}
	c := &blockCache{bs: bs, arena: arena, shards: make([]cacheShard, cacheShards), capacity: int64(per * cacheShards)}
	c.all.Store(true)
	for i := range c.shards {
		c.shards[i] = cacheShard{idx: make(map[uint64]int32, per), keys: make([]uint64, per), ref: make([]bool, per), first: i * per}
	}
	return c, nil
}

func (c *blockCache) shard(block uint64) *cacheShard {
	return &c.shards[(block*0x9E3779B97F4A7C15)>>58]
}

func (c *blockCache) slot(sh *cacheShard, i int) []byte {
	off := (sh.first + i) * c.bs
	return c.arena[off : off+c.bs]
}

// get copies len(dst) bytes at offset off of block into dst if cached.
func (c *blockCache) get(block uint64, dst []byte, off int) bool {
	if !c.cached(block) {
		c.misses.Add(1)
		return false
	}
	sh := c.shard(block)
	sh.mu.Lock()
	i, ok := sh.idx[block]
	if ok {
		copy(dst, c.slot(sh, int(i))[off:])
		sh.ref[i] = true
	}
	sh.mu.Unlock()
	if ok {
		c.hits.Add(1)
		c.windowHits.Add(1)
	} else {
		c.misses.Add(1)
	}
	// A window is admitWindow lookups, or while sampling as many blocks
	// (one lookup in admitSample), so that reuse found by the sample turns
	// every block on within the same span of data.
	if n := c.window.Add(1); n == admitWindow || (n == admitWindow/admitSample && !c.all.Load()) {
		hits := c.windowHits.Swap(0)
		c.window.Store(0)
		// Lookups racing with the reset count in either window: the
		// decision needs only the rate's order of magnitude.
		c.all.Store(c.filled.Load() < c.capacity || hits*admitHitRate >= n)
	}
	return ok
}

// cached says whether block is looked up and stored now: every block, or
// while sampling one in admitSample (by a hash of its number independent
// of the shard's).
func (c *blockCache) cached(block uint64) bool {
	return c.all.Load() || (block*0xBF58476D1CE4E5B9)>>32%admitSample == 0
}

// put stores a whole block read from the device.
func (c *blockCache) put(block uint64, data []byte) {
	if len(data) < c.bs || !c.cached(block) {
		return
	}
	sh := c.shard(block)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.idx[block]; ok {
		return
	}
	var i int
	if sh.used < len(sh.keys) {
		i = sh.used
		sh.used++
		c.filled.Add(1)
	} else {
		for sh.ref[sh.hand] {
			sh.ref[sh.hand] = false
			sh.hand = (sh.hand + 1) % len(sh.keys)
		}
		i = sh.hand
		delete(sh.idx, sh.keys[i])
		sh.hand = (sh.hand + 1) % len(sh.keys)
	}
	copy(c.slot(sh, i), data[:c.bs])
	sh.idx[block] = int32(i)
	sh.keys[i] = block
	sh.ref[i] = false
}

func (c *blockCache) close() error { return unix.Munmap(c.arena) }
