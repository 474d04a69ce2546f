// SPDX-License-Identifier: Apache-2.0

package raw

import (
	"bytes"
	"sync"
	"testing"
)

func TestBlockCache(t *testing.T) {
	const bs = 4096
	c, err := newBlockCache(cacheShards*2*bs, bs) // two blocks per shard
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	blk := func(n uint64) []byte { return bytes.Repeat([]byte{byte(n), byte(n >> 8)}, bs/2) }
	dst := make([]byte, 100)
	if c.get(5, dst, 0) {
		t.Fatal("hit in an empty cache")
	}
	c.put(5, blk(5))
	c.put(6, blk(6)[:bs-1]) // a short block is never cached
	if !c.get(5, dst, 10) || !bytes.Equal(dst, blk(5)[10:110]) {
		t.Fatal("cached block: wrong bytes at an offset")
	}
	if c.get(6, dst, 0) {
		t.Error("a short block was cached")
	}
	// Blocks landing in one shard: with room for two, filling it evicts,
	// and CLOCK keeps the one just used.
	var same []uint64
	for b := uint64(0); len(same) < 4; b++ {
		if c.shard(b) == c.shard(5) && b != 5 {
			same = append(same, b)
		}
	}
	c.put(same[0], blk(same[0])) // shard: {5, s0}
	c.get(5, dst, 0)             // 5 referenced
	c.put(same[1], blk(same[1])) // evicts s0 (5 gets a second chance)
	if !c.get(5, dst, 0) || c.get(same[0], dst, 0) || !c.get(same[1], dst, 0) {
		t.Error("CLOCK evicted the referenced block, or kept the unreferenced one")
	}
	if h, m := c.hits.Load(), c.misses.Load(); h < 3 || m < 2 {
		t.Errorf("hits %d misses %d", h, m)
	}
	if _, err := newBlockCache(bs, bs); err == nil {
		t.Error("a cache of less than a block per shard was accepted")
	}
}

func TestBlockCacheConcurrent(t *testing.T) {
	const bs = 4096
	c, err := newBlockCache(cacheShards*4*bs, bs)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]byte, bs)
			for i := 0; i < 2000; i++ {
				b := uint64((i*7 + g) % 500)
				if c.get(b, dst, 0) {
					if dst[0] != byte(b) || dst[bs-1] != byte(b>>8) {
						t.Errorf("block %d: another block's bytes", b)
						return
					}
				} else {
					blk := bytes.Repeat([]byte{byte(b)}, bs)
					blk[bs-1] = byte(b >> 8)
					c.put(b, blk)
				}
			}
		}()
	}
	wg.Wait()
}

// entries counts the blocks the cache holds.
func (c *blockCache) entries() (n int) {
	for i := range c.shards {
		c.shards[i].mu.Lock()
		n += len(c.shards[i].idx)
		c.shards[i].mu.Unlock()
	}
	return n
}

// TestBlockCacheAdmission: a cache stores every block until it is full; a
// full cache whose lookups miss then looks up and stores only a sample of
// the blocks; a window of hits on the sample turns every block back on.
func TestBlockCacheAdmission(t *testing.T) {
	const bs = 4096
	c, err := newBlockCache(cacheShards*64*bs, bs)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	data := make([]byte, bs)
	dst := make([]byte, 1)
	// Not full: a window of misses changes nothing.
	for i := 0; i < admitWindow; i++ {
		c.get(1<<40+uint64(i), dst, 0)
	}
	if !c.all.Load() {
		t.Fatal("a cache with free room samples")
	}
	for b := uint64(0); c.filled.Load() < c.capacity; b++ {
		c.put(b, data)
	}
	if got := c.entries(); int64(got) != c.capacity {
		t.Fatalf("filling stored %d blocks of %d", got, c.capacity)
	}
	// Full, and a window of misses: sampling.
	for i := 0; i < admitWindow; i++ {
		c.get(1<<41+uint64(i), dst, 0)
	}
	if c.all.Load() {
		t.Fatal("a full cache with no hits in a window still caches every block")
	}
	var sampled, other []uint64
	for b := uint64(1 << 42); len(sampled) < 64 || len(other) < 64; b++ {
		if c.cached(b) {
			sampled = append(sampled, b)
		} else {
			other = append(other, b)
		}
	}
	if n := len(sampled) + len(other); len(sampled) < n/admitSample/2 || len(sampled) > n/admitSample*2 {
		t.Errorf("sampling takes %d of %d blocks; want about 1 in %d", len(sampled), n, admitSample)
	}
	shards := map[*cacheShard]bool{}
	for b := uint64(0); len(shards) < cacheShards && b < 1<<20; b++ {
		if c.cached(b) {
			shards[c.shard(b)] = true
		}
	}
	if len(shards) < cacheShards {
		t.Errorf("sampled blocks land in %d of %d shards: sampling and sharding are correlated", len(shards), cacheShards)
	}
	for _, b := range other {
		c.put(b, data)
		if c.get(b, dst, 0) {
			t.Fatalf("block %d, not in the sample, was stored while sampling", b)
		}
	}
	for _, b := range sampled[:8] {
		c.put(b, data)
	}
	// Hits on the sample: within a window of sampled lookups, every block
	// is cached again.
	for i := 0; i < admitWindow/admitSample && !c.all.Load(); i++ {
		c.get(sampled[i%8], dst, 0)
	}
	if !c.all.Load() {
		t.Fatal("a window of hits on the sampled blocks left the cache sampling")
	}
	c.put(other[0], data)
	if !c.get(other[0], dst, 0) {
		t.Error("after a window of hits, a block outside the sample was not stored")
	}
}
