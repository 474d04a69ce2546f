// SPDX-License-Identifier: Apache-2.0

// Package raw is the raw-device subsystem behind the gds and bam
// backends: it reads samples' extents straight from the filesystem's
// block device with O_DIRECT, bypassing the filesystem and the page cache.
//
// One planner turns a sample's extents into aligned device reads;
// configuration alone makes it gds-like (whole extents rounded out to
// 4 KiB, merged, split at a maximum request size, one deep queue) or
// bam-like (fixed-size block requests from several queues, with a shared
// block cache). Reads run on an io_uring engine, or parallel pread workers
// where io_uring is refused. A freshness watch (inotify) and stat checks
// make sure a changed file is never served from the blocks it used to
// have.
package raw

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/internal/counts"
	"github.com/nvfeed/nvfeed/loader/internal/samplefile"
)

// Stale-map policies (option on_stale).
const (
	StaleFallback = "fallback" // read a changed file through the filesystem (counted)
	StaleFail     = "fail"     // fail it with an error wrapping bmap.ErrStale
)

// Freshness methods (option freshness): see package fresh.
const (
	FreshWatch = fresh.Watch
	FreshRead  = fresh.Read
)

// Engine names (option engine).
const (
	EngineAuto  = "auto"  // io_uring where the kernel allows it, else pread
	EngineUring = "uring" // io_uring only
	EnginePread = "pread" // parallel pread workers
)

// Config is the planner's and the engines' configuration: the only
// difference between gds and bam.
type Config struct {
	Engine      string // EngineAuto, EngineUring or EnginePread
	Queues      int    // submission queues (engines), requests spread round-robin
	QueueDepth  int    // requests in flight per queue
	RequestSize int    // bytes, a multiple of 4 KiB: the largest request, or with FixedBlocks every request's size
	// FixedBlocks makes every request one whole RequestSize-aligned device
	// block (bam); otherwise extents are rounded out to 4 KiB and split at
	// RequestSize (gds).
	FixedBlocks bool
	CacheBytes  int64  // a block cache of this size serves repeated blocks (needs FixedBlocks); 0 means none
	OnStale     string // StaleFallback or StaleFail
	// FixedBuffers registers the session's host batch memory with each
	// io_uring engine of its own (not with engines shared by sessions):
	// every page pinned at open instead of per request.
	FixedBuffers bool
	Freshness    string // FreshWatch or FreshRead
}

// engineOptions are the engine options gds and bam share.
func engineOptions() []backend.Option {
	return []backend.Option{
		{Name: "engine", Kind: backend.Enum, Default: EngineAuto, Choices: []string{EngineAuto, EngineUring, EnginePread},
			Doc: "auto: io_uring, else pread workers (Docker's default seccomp profile refuses io_uring)"},
		{Name: "fixed_buffers", Kind: backend.Bool, Default: true,
			Doc: "register the batch memory with io_uring (READ_FIXED), each slot once, at the first read into it: its pages stay pinned from then on instead of being pinned per request"},
	}
}

func freshnessOptions() []backend.Option {
	return []backend.Option{
		{Name: "on_stale", Kind: backend.Enum, Default: StaleFallback, Choices: []string{StaleFallback, StaleFail},
			Doc: "a file changed since mapping is read through the filesystem (fallback) or fails (fail)"},
		{Name: "freshness", Kind: backend.Enum, Default: FreshWatch, Choices: []string{FreshWatch, FreshRead},
			Doc: "how changes after open are caught: watch (inotify on the class directories) or read (stat after every raw read)"},
	}
}

// commonConfig reads the options gds and bam share.
func commonConfig(p backend.Params) Config {
	return Config{Engine: p.String("engine"), QueueDepth: int(p.Int("queue_depth")), OnStale: p.String("on_stale"), Freshness: p.String("freshness"),
		FixedBuffers: p.Bool("fixed_buffers")}
}

// GDSSpec describes the gds backend.
func GDSSpec() backend.Spec {
	return backend.Spec{
		Name:         "gds",
		ReadsExtents: true,
		Doc:          "GPUDirect-Storage-like: CPU-initiated O_DIRECT reads of whole raw extents from the block device at a queue depth",
		Options: append(append(engineOptions(),
			backend.Option{Name: "queue_depth", Kind: backend.Int, Default: int64(32), Min: 1, Max: 4096, Doc: "device requests in flight"},
			backend.Option{Name: "max_request", Kind: backend.Int, Default: int64(1 << 20), Min: backend.Align, Max: 64 << 20, Multiple: backend.Align, Doc: "split reads larger than this (bytes)"},
		), freshnessOptions()...),
		Open: func(m *bmap.Map, p backend.Params, env backend.Env) (backend.Backend, error) {
			c := commonConfig(p)
			c.Queues, c.RequestSize = 1, int(p.Int("max_request"))
			return Open("gds", m, c, env)
		},
	}
}

// BAMSpec describes the bam backend.
func BAMSpec() backend.Spec {
	return backend.Spec{
		Name:         "bam",
		ReadsExtents: true,
		Doc:          "BaM-style: fixed-size block requests from several queues, with a shared block cache",
		Options: append(append(engineOptions(),
			backend.Option{Name: "queue_depth", Kind: backend.Int, Default: int64(64), Min: 1, Max: 4096, Doc: "requests in flight per queue"},
			backend.Option{Name: "queues", Kind: backend.Int, Default: int64(4), Min: 1, Max: 256, Doc: "submission queues"},
			backend.Option{Name: "block_size", Kind: backend.Int, Default: int64(backend.Align), Min: backend.Align, Max: 1 << 20, Multiple: backend.Align, Doc: "request size (bytes)"},
			backend.Option{Name: "cache_mb", Kind: backend.Int, Default: int64(256), Min: 0, Max: 1 << 20, Doc: "block cache (MiB); 0 disables it; when full and rarely hit it caches a sample of the blocks"},
		), freshnessOptions()...),
		Open: func(m *bmap.Map, p backend.Params, env backend.Env) (backend.Backend, error) {
			c := commonConfig(p)
			c.Queues, c.RequestSize, c.FixedBlocks, c.CacheBytes = int(p.Int("queues")), int(p.Int("block_size")), true, p.Int("cache_mb")<<20
			return Open("bam", m, c, env)
		},
	}
}

// Backend reads raw samples from the block device; samples the map marks
// filesystem-only, and raw ones a user outside the guard's trust may
// change (backend.Guard.Writable), are read through the filesystem. After the raw reads of
// a sample complete, the live file is checked against the map (inode,
// size, mtime, ctime) as the freshness method says: a file changed before
// or during the read is never served from the blocks it used to have.
type Backend struct {
	name        string
	m           *bmap.Map
	guard       backend.Guard
	ownG        *fresh.Guard // the guard when it is ours (opened here) to close
	dev         *os.File
	cfg         Config
	plan        planner
	engines     []engine
	release     []func() error // shared engines and device queues: give them back
	ownsEngines bool           // the engines are this backend's: Close closes them
	next        atomic.Uint64  // round-robin queue choice
	trace       *tracer
	log         *slog.Logger
	fs          *samplefile.Reader // filesystem reads: filesystem-only and changed samples
	caller      *backend.Caller    // opens as the caller (Env.Cred); nil: as the process

	scMu      sync.Mutex
	scratches []*scratch // free planning scratch, reused across batches

	samples, raw, fsOnly, stale, errs, requests atomic.Int64
	rawBytes, bounced                           atomic.Int64 // device bytes read; of them into bounce memory
}

// Open opens m's block device read-only with O_DIRECT and starts the
// engines. It uses env.Guard, the map's shared freshness state, or opens
// its own (which checks that the filesystem mounted at the map's root is
// the one mapped, bmap.ErrStale otherwise, and stats every raw sample).
// name is how the backend reports itself.
func Open(name string, m *bmap.Map, cfg Config, env backend.Env) (*Backend, error) {
	if cfg.QueueDepth < 1 || cfg.Queues < 1 || cfg.RequestSize < backend.Align || cfg.RequestSize%backend.Align != 0 {
		return nil, fmt.Errorf("%w: %s: queues %d, queue depth %d, request size %d", backend.ErrOptions, name, cfg.Queues, cfg.QueueDepth, cfg.RequestSize)
	}
	if cfg.CacheBytes > 0 && !cfg.FixedBlocks {
		return nil, fmt.Errorf("%w: %s: a block cache needs fixed-size block requests", backend.ErrOptions, name)
	}
	if m.FSOnly() {
		return nil, fmt.Errorf("raw: %s: %w (mapped on %s): use backend file", name, backend.ErrNoRaw, m.Device.FSType)
	}
	log := env.Logger
	if log == nil {
		log = slog.Default()
	}
	b := &Backend{name: name, m: m, guard: env.Guard, cfg: cfg, log: log}
	var err error
	if b.fs, err = samplefile.NewReader(m, false); err != nil {
		return nil, fmt.Errorf("raw: %s: %w", name, err)
	}
	if env.Cred != nil {
		if b.caller, err = backend.NewCaller(*env.Cred, 2); err != nil {
			return nil, fmt.Errorf("raw: %s: reading as %v: %w", name, *env.Cred, err)
		}
	}
	if b.guard == nil {
		g, err := fresh.Open(m, cfg.Freshness, log)
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("raw: %s: %w", name, err)
		}
		b.guard, b.ownG = g, g
	} else if b.guard.Map() != m {
		b.Close()
		return nil, fmt.Errorf("%w: %s: the freshness guard given is another map's", backend.ErrOptions, name)
	}
	if b.guard.Method() == FreshRead {
		b.cfg.Freshness = FreshRead
	}
	devPath := b.guard.Device().Path
	fd, err := unix.Open(devPath, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("raw: %s: %w: open %s: %w (raw reads need read access to the device)", name, backend.ErrDevice, devPath, err)
	}
	b.dev = os.NewFile(uintptr(fd), devPath)
	var size uint64
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); errno != 0 {
		b.Close()
		return nil, fmt.Errorf("raw: %s: %s: BLKGETSIZE64: %w", name, devPath, errno)
	}
	// How far a read may run past a sample's last byte (planner.plan):
	// the device's logical block and the filesystem's block.
	sector, err := unix.IoctlGetInt(fd, unix.BLKSSZGET)
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("raw: %s: %s: BLKSSZGET: %w", name, devPath, err)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(m.Root, &sfs); err != nil {
		b.Close()
		return nil, fmt.Errorf("raw: %s: statfs %s: %w", name, m.Root, err)
	}
	fsBlock := sfs.Frsize
	if fsBlock <= 0 {
		fsBlock = sfs.Bsize
	}
	if sector <= 0 || sector&(sector-1) != 0 || fsBlock <= 0 || fsBlock&(fsBlock-1) != 0 {
		b.Close()
		return nil, fmt.Errorf("raw: %s: %s: logical block size %d, filesystem block size %d: want powers of two", name, devPath, sector, fsBlock)
	}
	b.plan = planner{reqSize: uint64(cfg.RequestSize), fixed: cfg.FixedBlocks, devPath: devPath, devSize: int64(size),
		sector: uint64(sector), fsBlock: uint64(fsBlock)}
	if env.Trace != nil {
		b.trace = newTracer(env.Trace, devPath)
	}
	for q := 0; q < cfg.Queues; q++ {
		if err := b.addEngine(q, env); err != nil {
			b.Close()
			return nil, fmt.Errorf("raw: %s: %w", name, err)
		}
	}
	if cfg.CacheBytes > 0 {
		if b.plan.cache, err = newBlockCache(cfg.CacheBytes, cfg.RequestSize); err != nil {
			b.Close()
			return nil, err
		}
	}
	log.Info("raw: backend ready", "backend", name, "device", devPath, "engine", b.engines[0].name(),
		"queues", cfg.Queues, "queue_depth", cfg.QueueDepth, "freshness", cfg.Freshness)
	return b, nil
}

// addEngine starts queue q's engine, or with env.Shared (and no trace)
// takes the one already serving this device, engine kind, queue depth and
// queue from another backend. A shared engine reads its own duplicate of
// the device descriptor, so it outlives the backend that made it.
func (b *Backend) addEngine(q int, x backend.Env) error {
	fd := int(b.dev.Fd())
	logFallback := func(err error) {
		if err != nil {
			b.log.Warn("raw: io_uring unavailable, using pread workers", "backend", b.name, "err", err)
		}
	}
	if x.Shared == nil || b.trace != nil {
		rs := b.ringSetup(x, true)
		var leave func() error // counts this engine out of its device's queue; nil: not in one
		if x.Devices != nil && b.cfg.Engine != EnginePread {
			var err error
			if rs.queue, leave, err = b.joinQueue(x.Devices); err != nil {
				return err
			}
		}
		e, fallback, err := newEngine(b.cfg.Engine, fd, b.cfg.QueueDepth, rs, b.trace)
		if leave != nil && (err != nil || fallback != nil) { // pread workers keep no share of the queue
			leave()
			leave = nil
		}
		if err != nil {
			return err
		}
		if q == 0 {
			logFallback(fallback)
		}
		b.engines, b.ownsEngines = append(b.engines, e), true
		if leave != nil {
			b.release = append(b.release, leave)
		}
		return nil
	}
	key := fmt.Sprintf("raw engine: device %s, engine %s, queue depth %d, queue %d",
		b.plan.devPath, b.cfg.Engine, b.cfg.QueueDepth, q)
	v, release, err := x.Shared.Acquire(key, func() (io.Closer, error) {
		dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("dup %s: %w", b.plan.devPath, err)
		}
		e, fallback, err := newEngine(b.cfg.Engine, dup, b.cfg.QueueDepth, b.ringSetup(x, false), nil)
		if err != nil {
			unix.Close(dup)
			return nil, err
		}
		if q == 0 {
			logFallback(fallback)
		}
		b.log.Info("raw: engine started, shared by the sessions on this device", "device", b.plan.devPath, "queue", q, "queue_depth", b.cfg.QueueDepth)
		return &ownedEngine{engine: e, fd: dup}, nil
	})
	if err != nil {
		return err
	}
	b.engines = append(b.engines, v.(*ownedEngine).engine)
	b.release = append(b.release, release)
	return nil
}

// joinQueue counts one more io_uring engine on this backend's device in
// devices (keyed by device number, whatever path names it) and returns
// the device's queue and how to count the engine out.
func (b *Backend) joinQueue(devices backend.Shared) (*deviceQueue, func() error, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(b.dev.Fd()), &st); err != nil {
		return nil, nil, fmt.Errorf("stat %s: %w", b.plan.devPath, err)
	}
	key := fmt.Sprintf("raw device queue: %d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	v, release, err := devices.Acquire(key, func() (io.Closer, error) {
		q := &deviceQueue{tags: deviceTags("/sys", st.Rdev)}
		b.log.Info("raw: device queue shared by the sessions' engines", "device", b.plan.devPath, "tags", q.tags)
		return q, nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", key, err)
	}
	dq := v.(*deviceQueue)
	dq.engines.Add(1)
	return dq, func() error {
		dq.engines.Add(-1)
		return release()
	}, nil
}

// ringSetup is how this backend's io_uring engines are set up; own says
// the engine is this backend's alone (a shared engine serves other
// sessions' memory too, so it registers none).
func (b *Backend) ringSetup(x backend.Env, own bool) ringSetup {
	rs := ringSetup{log: b.log}
	if own && b.cfg.FixedBuffers {
		rs.buffers = x.HostBuffers
	}
	return rs
}

// ownedEngine is a shared engine with the descriptor it reads.
type ownedEngine struct {
	engine
	fd int
}

// Close stops the engine, then closes its descriptor.
func (o *ownedEngine) Close() error {
	o.engine.close()
	return unix.Close(o.fd)
}

// PinBuffers registers now every batch slot that its engines register
// on first use (see uring.Ring.DeferBuffers) and not yet: what a
// session's first batches would otherwise pay, paid at once. For
// measurements that, like fio --fixedbufs, time reads only after
// registration (loaderd bench); a session does not call it.
func (b *Backend) PinBuffers() {
	for _, e := range b.engines {
		e.pinAll()
	}
}

// Name returns the name given to Open ("gds" or "bam").
func (b *Backend) Name() string { return b.name }

// Stats reports the engine, the device and the counters.
func (b *Backend) Stats() backend.Stats {
	c := counts.Counts{Samples: b.samples.Load(), RawSamples: b.raw.Load(), FSOnlySamples: b.fsOnly.Load(), StaleSamples: b.stale.Load(),
		Errors: b.errs.Load(), Requests: b.requests.Load(), RawBytes: b.rawBytes.Load(), BouncedBytes: b.bounced.Load()}
	for _, e := range b.engines {
		c.PeakInFlight += e.peakInflight()
	}
	if bc := b.plan.cache; bc != nil {
		c.CacheHits, c.CacheMisses = bc.hits.Load(), bc.misses.Load()
	}
	return backend.Stats{Engine: b.engines[0].name(),
		Labels:   []backend.Label{{Name: "device", Value: b.plan.devPath}, {Name: "freshness", Value: b.cfg.Freshness}},
		Counters: c.Counters()}
}

// ReadBatch reads a batch: raw samples from the device, the rest through
// the filesystem. See backend.Backend for the contract.
func (b *Backend) ReadBatch(ctx context.Context, reqs []backend.Request) error {
	sc := b.getScratch()
	defer b.putScratch(sc)
	sc.prepare(len(reqs))
	// Changes seen so far decide which samples are read guarded: one
	// non-blocking read of the watch per batch.
	b.guard.Poll()
	statAll := b.cfg.Freshness == FreshRead
	var fsIdx []int
	for i := range reqs {
		r := &reqs[i]
		r.Err = nil
		switch {
		case r.Sample.Reason != bmap.Raw, b.guard.Writable(r.Index):
			// Filesystem-only, or raw-mapped but changeable by a user the
			// guard does not trust: read through the filesystem (as the
			// caller), never from extents someone else could move.
			fsIdx = append(fsIdx, i)
		case b.guard.ChangedAtOpen(r.Index):
			b.onStale(r, b.check(r.Index))
		case statAll || b.guard.NeedStat(r.Index):
			b.planGuarded(i, r, sc)
		default:
			sc.how[i] = rawDirect
			r.Err = b.plan.plan(i, r, sc)
		}
	}
	b.samples.Add(int64(len(reqs)))
	b.fsOnly.Add(int64(len(fsIdx)))
	// Issued in the batch's own (shuffled) order: sorting each batch by
	// device offset measured no faster on either device (bench/ab.sh, 9
	// rounds, cold: gds 1.00x on the RAM device, 0.99x on virtio; bam
	// 0.97x and 1.01x; docs/decisions.md#reads-in-the-batchs-order), so
	// it is not done.
	grp := newOpGroup(len(sc.ops))
	for _, op := range sc.ops {
		op.grp = grp
	}
	b.requests.Add(int64(len(sc.ops)))
	var read, bounced int64
	for i := range sc.plans {
		p := &sc.plans[i]
		n := int64(len(p.op.buf))
		read += n
		if p.bounce || sc.how[p.request] == rawGuarded {
			bounced += n
		}
	}
	b.rawBytes.Add(read)
	b.bounced.Add(bounced)
	b.dispatch(sc.ops)
	// Filesystem-only samples are read while the device works.
	for _, i := range fsIdx {
		if err := ctx.Err(); err != nil {
			reqs[i].Err = err
		} else {
			reqs[i].Err = b.fs.Read(&reqs[i], samplefile.AsCaller(b.caller))
		}
	}
	<-grp.done // ops write into batch memory: always wait for them
	for i := range sc.plans {
		p := &sc.plans[i]
		if p.op.err != nil {
			if r := &reqs[p.request]; r.Err == nil {
				r.Err = &backend.SampleError{Index: r.Index, Path: r.Sample.Path, Err: fmt.Errorf("device %s bytes [%d,%d): %w",
					b.plan.devPath, p.op.off, p.op.off+int64(len(p.op.buf)), p.op.err)}
			}
			continue
		}
		if p.bounce {
			copy(p.dst, p.op.buf[p.src:])
		}
		if c := b.plan.cache; c != nil && sc.how[p.request] != rawGuarded {
			c.put(p.block, p.op.buf)
		}
	}
	for _, z := range sc.zeros {
		clear(z)
	}
	err := b.checkFresh(ctx, reqs, sc)
	if c := b.plan.cache; c != nil {
		// Blocks read for a guarded sample are cached once trusted.
		for i := range sc.plans {
			if p := &sc.plans[i]; p.op.err == nil && sc.how[p.request] == rawTrusted {
				c.put(p.block, p.op.buf)
			}
		}
	}
	return err
}

// planGuarded plans raw sample i, whose bytes need a stat before they are
// trusted (its class saw a change, it has other hard links, or freshness
// read): it is stat'ed first (found changed: the stale policy, no raw
// read), then read into bounce memory the size of its room and at its
// room's address modulo 4 KiB (so that the same blocks land in place),
// whose data checkFresh copies into the slot only once the stat after the
// read passes. Batch memory, which the client maps, never holds its raw
// bytes before then.
func (b *Backend) planGuarded(i int, r *backend.Request, sc *scratch) {
	if err := b.guard.Check(r.Index); err != nil {
		b.onStale(r, err)
		return
	}
	ph := int(r.Addr() % backend.Align)
	room, err := sc.alloc(ph + len(r.Buf))
	if err != nil {
		r.Err = &backend.SampleError{Index: r.Index, Path: r.Sample.Path, Err: err}
		return
	}
	room = room[ph : ph+len(r.Buf) : ph+len(r.Buf)]
	sc.how[i], sc.shadow[i] = rawGuarded, room
	shadow := *r
	shadow.Buf = room
	r.Err = b.plan.plan(i, &shadow, sc)
}

// onStale applies the stale policy to a raw sample found changed (cause
// wraps bmap.ErrStale): read it through the filesystem, or fail it.
func (b *Backend) onStale(r *backend.Request, cause error) {
	b.stale.Add(1)
	if b.cfg.OnStale == StaleFail {
		r.Err = &backend.SampleError{Index: r.Index, Path: r.Sample.Path, Err: cause}
		return
	}
	r.Err = b.fs.Read(r, samplefile.AsCaller(b.caller))
}

// checkFresh verifies each raw sample read against the live file, applies
// the stale policy, copies guarded samples that pass into their slots,
// counts, and returns the first error of the batch.
func (b *Backend) checkFresh(ctx context.Context, reqs []backend.Request, sc *scratch) error {
	var first error
	b.guard.Poll()
	statAll := b.cfg.Freshness == FreshRead
	// The samples to check, checked together (as a caller: one hand-off
	// per opener thread for the batch, not one per sample).
	sc.check, sc.checkAt = sc.check[:0], sc.checkAt[:0]
	for i := range reqs {
		r := &reqs[i]
		if how := sc.how[i]; how != notRaw && r.Err == nil {
			b.raw.Add(1)
			if how == rawGuarded || statAll || b.guard.NeedStat(r.Index) {
				sc.check, sc.checkAt = append(sc.check, r.Index), append(sc.checkAt, i)
			}
		}
	}
	for k, err := range b.checkAll(sc.check) {
		i := sc.checkAt[k]
		r := &reqs[i]
		if err != nil {
			b.onStale(r, err)
		} else if sc.how[i] == rawGuarded {
			copy(r.Data(), sc.shadow[i][r.At:])
			sc.how[i] = rawTrusted
		}
	}
	for i := range reqs {
		r := &reqs[i]
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

// dispatch hands ops to the engines: one queue takes them all; several
// share them round-robin.
func (b *Backend) dispatch(ops []*ioOp) {
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

func (b *Backend) getScratch() *scratch {
	b.scMu.Lock()
	defer b.scMu.Unlock()
	if n := len(b.scratches); n > 0 {
		sc := b.scratches[n-1]
		b.scratches = b.scratches[:n-1]
		return sc
	}
	return &scratch{}
}

func (b *Backend) putScratch(sc *scratch) {
	sc.reset()
	b.scMu.Lock()
	b.scratches = append(b.scratches, sc)
	b.scMu.Unlock()
}

// Close stops the engines, frees the bounce memory and the cache, and
// closes the device. No ReadBatch may be running.
func (b *Backend) Close() error {
	var errs []error
	if b.ownsEngines {
		for _, e := range b.engines {
			e.close()
		}
	}
	for _, r := range b.release {
		errs = append(errs, r())
	}
	if b.trace != nil {
		errs = append(errs, b.trace.close())
	}
	if b.dev != nil {
		errs = append(errs, b.dev.Close())
	}
	if b.plan.cache != nil {
		errs = append(errs, b.plan.cache.close())
	}
	for _, sc := range b.scratches {
		errs = append(errs, sc.free())
	}
	b.scratches = nil
	if b.ownG != nil {
		errs = append(errs, b.ownG.Close())
	}
	if b.caller != nil {
		b.caller.Close()
	}
	return errors.Join(errs...)
}

var _ backend.Backend = (*Backend)(nil)
