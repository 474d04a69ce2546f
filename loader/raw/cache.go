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
type blockCache struct {
	bs           int
	arena        []byte
	shards       []cacheShard
	hits, misses atomic.Int64
}

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
	c := &blockCache{bs: bs, arena: arena, shards: make([]cacheShard, cacheShards)}
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
	} else {
		c.misses.Add(1)
	}
	return ok
}

// put stores a whole block read from the device.
func (c *blockCache) put(block uint64, data []byte) {
	if len(data) < c.bs {
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
