package loader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
)

// Stale-map policies for Options.OnStale.
const (
	StaleFallback = "fallback" // read a changed file through the filesystem (counted)
	StaleFail     = "fail"     // refuse it with an error wrapping bmap.ErrStale
)

// Freshness methods for RawOptions.Freshness. Both stat every sample when
// the backend opens.
const (
	// FreshWatch watches the class directories with inotify and stats a
	// sample after its raw read only when its class saw a change or the
	// file has other hard links: one poll per batch instead of a stat per
	// sample, and as safe for changes made through the dataset's paths.
	FreshWatch = "watch"
	// FreshRead stats every raw sample after its read.
	FreshRead = "read"
)

// RawOptions configures the gds and bam backends.
type RawOptions struct {
	Engine     string    // EngineAuto (default), EngineUring or EnginePread
	QueueDepth int       // requests in flight per queue; 0 means 32 (gds) or 64 (bam)
	MaxRequest int       // gds: split reads larger than this (bytes, multiple of 4 KiB); 0 means 1 MiB
	Queues     int       // bam: submission queues; 0 means 4
	BlockSize  int       // bam: request size in bytes, a multiple of 4 KiB; 0 means 4 KiB
	CacheBytes int64     // bam: block cache size; 0 means 256 MiB, negative disables it
	OnStale    string    // StaleFallback (default) or StaleFail
	Freshness  string    // FreshWatch (default) or FreshRead: how changed files are detected
	Trace      io.Writer // if set, every device read is logged as a fio iolog v2 line
}

// RawBackend reads raw samples straight from the filesystem's block device
// with O_DIRECT, bypassing the filesystem and the page cache. It serves
// both "gds" (CPU-initiated reads of whole extents at a queue depth, like
// GPUDirect Storage's cuFile path) and "bam" (fixed-size block requests
// from several queues with a shared block cache, like BaM).
//
// Samples the map marks filesystem-only are read through the filesystem.
// After the raw reads of a sample complete, the live file is checked
// against the map (inode, size, mtime, ctime): a file changed before or
// during the read is never served from the blocks it used to have.
type RawBackend struct {
	name    string
	m       *bmap.Map
	ck      *bmap.Checker
	dev     *os.File
	devPath string
	devSize int64
	engines []engine
	next    atomic.Uint64 // round-robin queue choice for bam
	o       RawOptions
	cache   *blockCache
	trace   *tracer
	log     *slog.Logger

	scratches sync.Pool // *scratch

	watch     *dirWatcher // nil with FreshRead
	staleOpen bitset      // samples found changed at open
	multiLink bitset      // samples with other hard links: always stat after reading

	raw, fsOnly, stale, errs, requests atomic.Int64
}

// ErrDevice is returned (wrapped) when the block device cannot be opened
// for raw reads.
var ErrDevice = errors.New("cannot read the block device")

// NewRawBackend opens m's block device for the named mode ("gds" or
// "bam"). It checks that the filesystem mounted at the map's root is the
// one mapped (bmap.ErrStale otherwise).
func NewRawBackend(m *bmap.Map, mode string, o RawOptions, log *slog.Logger) (*RawBackend, error) {
	if o.OnStale == "" {
		o.OnStale = StaleFallback
	}
	if o.OnStale != StaleFallback && o.OnStale != StaleFail {
		return nil, fmt.Errorf("%w: on_stale %q (want fallback or fail)", ErrOptions, o.OnStale)
	}
	if o.Freshness == "" {
		o.Freshness = FreshWatch
	}
	if o.Freshness != FreshWatch && o.Freshness != FreshRead {
		return nil, fmt.Errorf("%w: freshness %q (want watch or read)", ErrOptions, o.Freshness)
	}
	switch mode {
	case "gds":
		o.QueueDepth = cmpOr(o.QueueDepth, 32)
		o.MaxRequest = cmpOr(o.MaxRequest, 1<<20)
		o.Queues = 1
	case "bam":
		o.QueueDepth = cmpOr(o.QueueDepth, 64)
		o.Queues = cmpOr(o.Queues, 4)
		o.BlockSize = cmpOr(o.BlockSize, Align)
		o.MaxRequest = o.BlockSize
		if o.CacheBytes == 0 {
			o.CacheBytes = 256 << 20
		}
	default:
		return nil, fmt.Errorf("%w: raw backend mode %q", ErrOptions, mode)
	}
	if o.QueueDepth < 1 || o.QueueDepth > 4096 || o.Queues < 1 || o.Queues > 256 {
		return nil, fmt.Errorf("%w: queue depth %d and queues %d must be in [1,4096] and [1,256]", ErrOptions, o.QueueDepth, o.Queues)
	}
	if o.MaxRequest < Align || o.MaxRequest%Align != 0 {
		return nil, fmt.Errorf("%w: request size %d must be a positive multiple of %d", ErrOptions, o.MaxRequest, Align)
	}
	ck, err := m.NewChecker()
	if err != nil {
		return nil, fmt.Errorf("loader: %s: %w", mode, err)
	}
	b := &RawBackend{name: mode, m: m, ck: ck, o: o, log: log}
	b.devPath = ck.Device().Path
	fd, err := unix.Open(b.devPath, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		ck.Close()
		return nil, fmt.Errorf("loader: %s: %w: open %s: %w (raw reads need read access to the device: run as a user who has it, or use --backend file)", mode, ErrDevice, b.devPath, err)
	}
	b.dev = os.NewFile(uintptr(fd), b.devPath)
	var size uint64
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); errno != 0 {
		b.Close()
		return nil, fmt.Errorf("loader: %s: %s: BLKGETSIZE64: %w", mode, b.devPath, errno)
	}
	b.devSize = int64(size)
	if o.Trace != nil {
		b.trace = newTracer(o.Trace, b.devPath)
	}
	for q := 0; q < o.Queues; q++ {
		e, fallback, err := newEngine(o.Engine, fd, o.QueueDepth, b.trace)
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("loader: %s: %w", mode, err)
		}
		if fallback != nil && q == 0 {
			log.Warn("loader: io_uring unavailable, using pread workers", "backend", mode, "err", fallback)
		}
		b.engines = append(b.engines, e)
	}
	if mode == "bam" && o.CacheBytes > 0 {
		if b.cache, err = newBlockCache(o.CacheBytes, o.BlockSize); err != nil {
			b.Close()
			return nil, err
		}
	}
	if err := b.checkAtOpen(); err != nil {
		b.Close()
		return nil, err
	}
	log.Info("loader: raw backend ready", "backend", mode, "device", b.devPath, "engine", b.engines[0].name(),
		"queues", o.Queues, "queue_depth", o.QueueDepth)
	return b, nil
}

func cmpOr(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// checkAtOpen starts the directory watch (FreshWatch), then stats every
// raw sample: changed ones are never read raw, multi-link ones are
// re-checked after every read.
func (b *RawBackend) checkAtOpen() error {
	if b.o.Freshness == FreshWatch {
		w, err := newDirWatcher(b.m.Root, b.m.Classes)
		if err != nil {
			b.log.Warn("loader: cannot watch the dataset, checking every read instead", "err", err)
			b.o.Freshness = FreshRead
		} else {
			b.watch = w
		}
	}
	n := len(b.m.Samples)
	b.staleOpen, b.multiLink = newBitset(n), newBitset(n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lo := int(next.Add(256)) - 256
				if lo >= n {
					return
				}
				for i := lo; i < min(lo+256, n); i++ {
					if b.m.Samples[i].Reason != bmap.Raw {
						continue
					}
					nlink, err := b.ck.CheckLinks(i)
					if err != nil {
						b.staleOpen.set(i)
					} else if nlink > 1 {
						b.multiLink.set(i)
					}
				}
			}
		}()
	}
	wg.Wait()
	return nil
}

// bitset is a fixed set of sample indices, safe for concurrent set.
type bitset []atomic.Uint64

func newBitset(n int) bitset    { return make(bitset, (n+63)/64) }
func (s bitset) set(i int)      { s[i/64].Or(1 << (i % 64)) }
func (s bitset) has(i int) bool { return s[i/64].Load()&(1<<(i%64)) != 0 }

// Name returns "gds" or "bam".
func (b *RawBackend) Name() string { return b.name }

// Info reports the engine, queues and counters.
func (b *RawBackend) Info() map[string]any {
	var peak int64
	for _, e := range b.engines {
		peak += e.peakInflight()
	}
	info := map[string]any{
		"engine": b.engines[0].name(), "device": b.devPath, "queues": b.o.Queues, "queue_depth": b.o.QueueDepth,
		"requests": b.requests.Load(), "peak_in_flight": peak, "raw_samples": b.raw.Load(),
		"fs_only_samples": b.fsOnly.Load(), "stale_samples": b.stale.Load(), "errors": b.errs.Load(),
		"freshness": b.o.Freshness,
	}
	if b.name == "bam" {
		info["block_size"] = b.o.BlockSize
	} else {
		info["max_request"] = b.o.MaxRequest
	}
	if b.cache != nil {
		h, m := b.cache.hits.Load(), b.cache.misses.Load()
		info["cache_bytes"] = b.o.CacheBytes
		info["cache_hits"], info["cache_misses"] = h, m
		if h+m > 0 {
			info["cache_hit_rate"] = float64(h) / float64(h+m)
		}
	}
	return info
}

// segPlan is how one aligned device read reaches its sample.
type segPlan struct {
	op      *ioOp
	dst     []byte // where the sample's bytes go
	src     int    // offset of dst's first byte within op.buf, when bounced
	bounce  bool   // op reads into a bounce buffer; copy after
	block   uint64 // bam: device block number, for cache insertion
	request int    // index of the request in the batch
}

// ReadBatch reads a batch: raw samples from the device, the rest through
// the filesystem.
func (b *RawBackend) ReadBatch(ctx context.Context, reqs []Request) error {
	sc := b.getScratch()
	defer b.putScratch(sc)
	var fsIdx []int
	for i := range reqs {
		r := &reqs[i]
		r.Err = nil
		switch {
		case r.Sample.Reason != bmap.Raw:
			fsIdx = append(fsIdx, i)
		case b.staleOpen.has(r.Index):
			b.onStale(r, b.ck.Check(r.Index))
		default:
			if err := b.plan(i, r, sc); err != nil {
				r.Err = err
			}
		}
	}
	b.fsOnly.Add(int64(len(fsIdx)))
	// Issue in device order.
	slices.SortFunc(sc.ops, func(x, y *ioOp) int { return int(x.off>>12) - int(y.off>>12) })
	grp := newOpGroup(len(sc.ops))
	for _, op := range sc.ops {
		op.grp = grp
	}
	b.requests.Add(int64(len(sc.ops)))
	b.dispatch(sc.ops)
	// Filesystem-only samples are read while the device works.
	for _, i := range fsIdx {
		if err := ctx.Err(); err != nil {
			reqs[i].Err = err
		} else {
			reqs[i].Err = ReadFile(b.m.Root, &reqs[i], false)
		}
	}
	<-grp.done // ops write into batch memory: always wait for them
	for i := range sc.plans {
		p := &sc.plans[i]
		if p.op.err != nil {
			if r := &reqs[p.request]; r.Err == nil {
				r.Err = &SampleError{r.Index, r.Sample.Path, fmt.Errorf("device %s bytes [%d,%d): %w", b.devPath, p.op.off, p.op.off+int64(len(p.op.buf)), p.op.err)}
			}
			continue
		}
		if p.bounce {
			copy(p.dst, p.op.buf[p.src:])
		}
		if b.cache != nil {
			b.cache.put(p.block, p.op.buf)
		}
	}
	for _, z := range sc.zeros {
		clear(z)
	}
	return b.checkFresh(ctx, reqs)
}

// onStale applies the stale policy to a raw sample found changed (cause
// wraps bmap.ErrStale): read it through the filesystem, or fail it.
func (b *RawBackend) onStale(r *Request, cause error) {
	b.stale.Add(1)
	if b.o.OnStale == StaleFail {
		r.Err = &SampleError{r.Index, r.Sample.Path, cause}
		return
	}
	r.Err = ReadFile(b.m.Root, r, false)
}

// checkFresh verifies each raw sample read against the live file, applies
// the stale policy, counts, and returns the first error of the batch.
func (b *RawBackend) checkFresh(ctx context.Context, reqs []Request) error {
	var first error
	if b.watch != nil {
		b.watch.poll()
	}
	for i := range reqs {
		r := &reqs[i]
		if r.Sample.Reason == bmap.Raw && r.Err == nil && !b.staleOpen.has(r.Index) {
			b.raw.Add(1)
			needStat := b.watch == nil || b.multiLink.has(r.Index) || b.watch.changed(r.Sample.Label)
			if needStat {
				if err := b.ck.Check(r.Index); err != nil {
					b.onStale(r, err)
				}
			}
		}
		if r.Err != nil {
			b.errs.Add(1)
			if first == nil {
				first = r.Err
			}
		}
	}
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// dispatch hands ops to the engines: gds has one queue; bam spreads ops
// over its queues round-robin.
func (b *RawBackend) dispatch(ops []*ioOp) {
	if len(ops) == 0 {
		return
	}
	if len(b.engines) == 1 {
		b.engines[0].submit(ops)
		return
	}
	per := (len(ops) + len(b.engines) - 1) / len(b.engines)
	start := int(b.next.Add(1))
	for q := range b.engines {
		lo := q * per
		if lo >= len(ops) {
			break
		}
		b.engines[(start+q)%len(b.engines)].submit(ops[lo:min(lo+per, len(ops))])
	}
}

// plan turns one raw sample into device reads. Aligned pieces are read
// straight into the sample's batch memory; pieces whose device offset and
// memory offset disagree modulo 4 KiB, or that would spill over a
// neighbour, go through a bounce buffer. bam splits at its block size and
// serves cached blocks by copy.
func (b *RawBackend) plan(ri int, r *Request, sc *scratch) error {
	s := r.Sample
	sc.segs = s.Segments(sc.segs[:0])
	size := uint64(s.Size)
	for _, g := range sc.segs {
		if g.Zero {
			sc.zeros = append(sc.zeros, r.Buf[g.FileOff:g.FileOff+g.Len])
			continue
		}
		if int64(g.DevOff+g.Len) > b.devSize {
			return &SampleError{r.Index, s.Path, fmt.Errorf("device %s bytes [%d,%d) past the end of the device (%d bytes)", b.devPath, g.DevOff, g.DevOff+g.Len, b.devSize)}
		}
		step := uint64(b.o.MaxRequest)
		lo := g.DevOff &^ (Align - 1) // gds: reads start at the 4 KiB boundary
		if b.name == "bam" {
			lo = g.DevOff - g.DevOff%step // bam: whole device blocks
		}
		for cur := lo; cur < g.DevOff+g.Len; {
			end := min(cur+step, alignUpU(g.DevOff+g.Len))
			if b.name == "bam" {
				end = cur + step
			}
			// The part of [cur,end) that belongs to this segment.
			a, z := max(cur, g.DevOff), min(end, g.DevOff+g.Len)
			fileA := g.FileOff + (a - g.DevOff)
			dst := r.Buf[fileA : fileA+(z-a)]
			block := cur / step
			if b.cache != nil && b.cache.get(block, dst, int(a-cur)) {
				cur = end
				continue
			}
			// Direct when the aligned range maps onto this sample's own
			// memory without touching bytes another piece writes: memory
			// offset congruent, and the range ends at the segment's end or
			// is whole, or runs only into the slack after the sample.
			memStart := int64(fileA) - int64(a-cur)
			memEnd := memStart + int64(end-cur)
			direct := memStart >= 0 && uint64(memStart)%Align == 0 && a == cur &&
				(z == end || (z == g.DevOff+g.Len && fileA+(z-a) == size)) && memEnd <= int64(len(r.Buf))
			op := sc.newOp(int64(cur))
			p := segPlan{op: op, dst: dst, request: ri, block: block}
			if direct {
				op.buf = r.Buf[memStart:memEnd:memEnd]
			} else {
				op.buf = sc.alloc(int(end - cur))
				p.bounce, p.src = true, int(a-cur)
			}
			sc.plans = append(sc.plans, p)
			sc.ops = append(sc.ops, op)
			cur = end
		}
	}
	return nil
}

func alignUpU(n uint64) uint64 { return (n + Align - 1) &^ (Align - 1) }

// Close stops the engines and closes the device.
func (b *RawBackend) Close() error {
	for _, e := range b.engines {
		e.close()
	}
	var errs []error
	if b.trace != nil {
		errs = append(errs, b.trace.close())
	}
	if b.dev != nil {
		errs = append(errs, b.dev.Close())
	}
	if b.cache != nil {
		errs = append(errs, b.cache.close())
	}
	if b.watch != nil {
		errs = append(errs, b.watch.close())
	}
	errs = append(errs, b.ck.Close())
	return errors.Join(errs...)
}

var _ Backend = (*RawBackend)(nil)

// scratch is one batch's planning state, pooled so the read path does
// not allocate per request: plans, ops (from a slab of ioOps), zero
// ranges, and aligned bounce memory for reads that cannot land in place.
// The bounce chunks are ordinary (non-moving) heap memory kept alive by
// the batch's plans until the reads complete.
type scratch struct {
	segs   []bmap.Segment
	plans  []segPlan
	ops    []*ioOp
	zeros  [][]byte
	slabs  [][]ioOp // ioOps; a slab never grows, so pointers stay valid
	nops   int
	chunks [][]byte
	cur    int // chunk in use
	off    int // next free byte in it
}

const (
	bounceChunk = 1 << 20
	opSlab      = 256
)

// newOp returns a zeroed ioOp for device offset off.
func (sc *scratch) newOp(off int64) *ioOp {
	slab, i := sc.nops/opSlab, sc.nops%opSlab
	if slab == len(sc.slabs) {
		sc.slabs = append(sc.slabs, make([]ioOp, opSlab))
	}
	sc.nops++
	op := &sc.slabs[slab][i]
	*op = ioOp{off: off}
	return op
}

// alloc returns n bytes (rounded up to Align) of aligned bounce memory.
func (sc *scratch) alloc(n int) []byte {
	n = int(alignUp(int64(n)))
	for {
		if sc.cur < len(sc.chunks) && len(sc.chunks[sc.cur])-sc.off >= n {
			p := sc.chunks[sc.cur][sc.off : sc.off+n : sc.off+n]
			sc.off += n
			return p
		}
		if sc.cur < len(sc.chunks) && sc.off > 0 {
			sc.cur, sc.off = sc.cur+1, 0
			continue
		}
		if sc.cur == len(sc.chunks) {
			sc.chunks = append(sc.chunks, directio.AlignedBlock(max(bounceChunk, n)))
		} else if len(sc.chunks[sc.cur]) < n {
			sc.chunks[sc.cur] = directio.AlignedBlock(n)
		}
	}
}

func (b *RawBackend) getScratch() *scratch {
	if sc, ok := b.scratches.Get().(*scratch); ok {
		return sc
	}
	return &scratch{}
}

func (b *RawBackend) putScratch(sc *scratch) {
	clear(sc.plans) // drop references to batch memory
	clear(sc.zeros)
	sc.plans, sc.ops, sc.zeros = sc.plans[:0], sc.ops[:0], sc.zeros[:0]
	sc.nops, sc.cur, sc.off = 0, 0, 0
	b.scratches.Put(sc)
}
