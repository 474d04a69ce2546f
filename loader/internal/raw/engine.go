// SPDX-License-Identifier: Apache-2.0

package raw

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/faults"
	"github.com/nvfeed/nvfeed/internal/uring"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/internal/samplefile"
)

// ioOp is one aligned read of the block device into memory outside the Go
// heap (batch memory or mmap'd bounce memory).
type ioOp struct {
	buf  []byte // destination: aligned address and length
	off  int64  // device offset, aligned
	path string // the sample read, for fault injection
	got  int    // bytes read so far
	err  error
	grp  *opGroup
}

// opGroup completes when all its ops have.
type opGroup struct {
	pending atomic.Int64
	done    chan struct{}
}

func newOpGroup(n int) *opGroup {
	g := &opGroup{done: make(chan struct{})}
	g.pending.Store(int64(n))
	if n == 0 {
		close(g.done)
	}
	return g
}

func (g *opGroup) finish() {
	if g.pending.Add(-1) == 0 {
		close(g.done)
	}
}

// engine issues device reads. submit never blocks for long; each op
// completes exactly once by calling op.grp.finish.
type engine interface {
	name() string
	submit(ops []*ioOp)
	// pinAll registers now every batch slot not registered yet (nothing
	// where the engine registers none) and returns once it has.
	pinAll()
	peakInflight() int64
	close()
}

// newEngine starts an engine reading fd with qd requests in flight. With
// EngineAuto it falls back to pread when io_uring is refused (Docker's
// default seccomp profile blocks it) and says so in fallback.
func newEngine(kind string, fd, qd int, rs ringSetup, trace *tracer) (e engine, fallback error, err error) {
	switch kind {
	case "", EngineAuto, EngineUring:
		u, err := newUringEngine(fd, qd, rs, trace)
		if err == nil {
			return u, nil, nil
		}
		if kind == EngineUring || !errors.Is(err, uring.ErrUnsupported) {
			return nil, nil, err
		}
		return newPreadEngine(fd, qd, trace), err, nil
	case EnginePread:
		return newPreadEngine(fd, qd, trace), nil, nil
	}
	return nil, nil, fmt.Errorf("%w: engine %q (want auto, uring or pread)", backend.ErrOptions, kind)
}

// tracer writes every device read, in issue order, as a fio iolog (v2)
// line, so fio can replay exactly the loader's reads.
// A write error is kept by the bufio.Writer and returned by close.
type tracer struct {
	mu  sync.Mutex
	w   *bufio.Writer
	dev string
}

func newTracer(w io.Writer, dev string) *tracer {
	t := &tracer{w: bufio.NewWriterSize(w, 1<<20), dev: dev}
	fmt.Fprintf(t.w, "fio version 2 iolog\n%s add\n%s open\n", dev, dev)
	return t
}

func (t *tracer) read(off int64, n int) {
	if t == nil {
		return
	}
	t.mu.Lock()
	fmt.Fprintf(t.w, "%s read %d %d\n", t.dev, off, n)
	t.mu.Unlock()
}

func (t *tracer) close() error {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.w, "%s close\n", t.dev)
	return t.w.Flush()
}

// uringEngine owns one io_uring from one goroutine.
type uringEngine struct {
	fd    int
	ring  *uring.Ring
	queue *deviceQueue // nil: in flight up to qd
	in    chan []*ioOp
	pins  chan chan struct{} // pinAll's requests to the ring's thread
	qd    int
	peak  atomic.Int64
	trace *tracer
	log   *slog.Logger // nil: nothing logged
	wg    sync.WaitGroup
}

// ringSetup says how an engine sets up its ring.
type ringSetup struct {
	// buffers are registered (batch memory), each piece on its first read:
	// reads into them are READ_FIXED, with no page pinning per request (the A/B:
	// docs/decisions.md#io_uring-single-issuer-registered-buffers-no-registered-files). If the kernel refuses (a memlock limit), the engine reads
	// without and says so through log.
	buffers [][]byte
	log     *slog.Logger
	// queue is the device's queue this engine shares with the other
	// sessions' engines; nil: no limit but its own depth.
	queue *deviceQueue
}

func newUringEngine(fd, qd int, rs ringSetup, trace *tracer) (*uringEngine, error) {
	e := &uringEngine{fd: fd, in: make(chan []*ioOp, 64), pins: make(chan chan struct{}), trace: trace}
	// The ring is made, registered with, submitted to and reaped from one
	// locked OS thread: what SINGLE_ISSUER requires.
	ready := make(chan error, 1)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		// SINGLE_ISSUER|DEFER_TASKRUN: completion work runs when this
		// thread waits for it, not as interrupts of it (A/B in
		// docs/decisions.md#io_uring-single-issuer-registered-buffers-no-registered-files); kernels before 6.1 refuse it: plain ring.
		r, err := uring.NewWith(uint32(qd), uring.Options{SingleIssuer: true})
		if errors.Is(err, uring.ErrFlags) {
			r, err = uring.New(uint32(qd))
		}
		if err != nil {
			ready <- err
			return
		}
		// Registered lazily: a piece of a slot is pinned when the first
		// read into it is issued, so open pins nothing and a session's
		// pinned memory is the pieces it has read into. Kernels without
		// sparse tables (before 5.19) pin the whole batch memory now.
		err = r.DeferBuffers(rs.buffers)
		if errors.Is(err, uring.ErrUnsupported) {
			err = r.RegisterBuffers(rs.buffers)
		}
		if err != nil && rs.log != nil {
			rs.log.Warn("raw: batch memory not registered with io_uring: requests pin their pages one by one", "err", err)
		}
		e.ring, e.qd, e.log, e.queue = r, min(qd, int(r.Entries())), rs.log, rs.queue
		ready <- nil
		e.loop()
		r.Close()
	}()
	if err := <-ready; err != nil {
		e.wg.Wait()
		return nil, err
	}
	return e, nil
}

func (e *uringEngine) name() string        { return EngineUring }
func (e *uringEngine) submit(ops []*ioOp)  { e.in <- ops }
func (e *uringEngine) peakInflight() int64 { return e.peak.Load() }
func (e *uringEngine) close()              { close(e.in); e.wg.Wait() }

// pinAll asks the ring's thread (SINGLE_ISSUER: the only one that may
// register) to register every deferred slot, and waits.
func (e *uringEngine) pinAll() {
	done := make(chan struct{})
	e.pins <- done
	<-done
}

// pinNow serves a pinAll request on the ring's thread.
func (e *uringEngine) pinNow(done chan struct{}) {
	e.ring.PinDeferred()
	e.logDeferErr()
	close(done)
}

// logDeferErr logs a slot's failed registration, if one failed since the
// last call (on the ring's thread).
func (e *uringEngine) logDeferErr() {
	if err := e.ring.TakeDeferErr(); err != nil && e.log != nil {
		e.log.Warn("raw: a batch slot not registered with io_uring: its requests pin their pages one by one", "err", err)
	}
}

func (e *uringEngine) loop() {
	slots := make([]*ioOp, e.qd)
	free := make([]int, 0, e.qd)
	for i := e.qd - 1; i >= 0; i-- {
		free = append(free, i)
	}
	var pending []*ioOp
	inflight, closed := 0, false
	take := func(ops []*ioOp, ok bool) {
		if !ok {
			closed = true
			return
		}
		pending = append(pending, ops...)
	}
	// poll takes what has come (reads, a pinAll) without waiting; false
	// when nothing had.
	poll := func() bool {
		select {
		case ops, ok := <-e.in:
			take(ops, ok)
		case done := <-e.pins:
			e.pinNow(done)
		default:
			return false
		}
		return true
	}
	for {
		if inflight == 0 && len(pending) == 0 {
			if closed {
				return
			}
			// Idle: nothing is pinned ahead of the reads. A read pins
			// the pieces it lands in, so a slot's part no batch uses is
			// never pinned (docs/decisions.md#batch-memory-pinned-where-read).
			select {
			case ops, ok := <-e.in:
				take(ops, ok)
			case done := <-e.pins:
				e.pinNow(done)
			}
			continue
		}
		for !closed && poll() {
		}
		for limit := e.queue.limit(e.qd); len(pending) > 0 && len(free) > 0 && inflight < limit; {
			op := pending[0]
			pending = pending[1:]
			slot := free[len(free)-1]
			free = free[:len(free)-1]
			slots[slot] = op
			e.trace.read(op.off+int64(op.got), len(op.buf)-op.got)
			e.ring.PrepRead(e.fd, op.buf[op.got:], uint64(op.off)+uint64(op.got), uint64(slot))
			inflight++
		}
		e.logDeferErr()
		if int64(inflight) > e.peak.Load() {
			e.peak.Store(int64(inflight))
		}
		// Wait for half of what is in flight, not for one completion: half
		// the enter calls (and thread hand-offs), the device queue staying
		// at least half full. Measured (docs/decisions.md, io_uring): CPU per GB 0.094
		// -> 0.080 s on the RAM-backed device, 0.147 -> 0.134 s on the
		// virtio one, throughput the same or better on both.
		if err := e.ring.Submit(uint32(max(1, inflight/2))); err != nil && !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EBUSY) {
			// The ring itself failed: fail what is not yet submitted; what
			// is in flight still completes below.
			for _, op := range pending {
				op.err = err
				op.grp.finish()
			}
			pending = nil
		}
		e.ring.Reap(func(c uring.CQE) {
			op := slots[c.UserData]
			slots[c.UserData] = nil
			free = append(free, int(c.UserData))
			inflight--
			n, err := int(c.Res), error(nil)
			if c.Res < 0 {
				n, err = 0, unix.Errno(-c.Res)
			}
			if ft, ok := faults.Inject(faults.DeviceRead, op.path); ok {
				n, err = ft.Apply(n, err, backend.Align)
			}
			switch {
			case err != nil:
				op.err = err
			case n == 0:
				op.err = ErrPastEnd
			default:
				op.got += n
				if op.got < len(op.buf) { // short read: ask for the rest
					pending = append(pending, op)
					return
				}
			}
			op.grp.finish()
		})
	}
}

// preadEngine runs qd goroutines each issuing one pread at a time.
type preadEngine struct {
	fd       int
	in       chan *ioOp
	inflight atomic.Int64
	peak     atomic.Int64
	trace    *tracer
	wg       sync.WaitGroup
}

func newPreadEngine(fd, qd int, trace *tracer) *preadEngine {
	e := &preadEngine{fd: fd, in: make(chan *ioOp, 4*qd), trace: trace}
	for i := 0; i < qd; i++ {
		e.wg.Add(1)
		go e.worker()
	}
	return e
}

func (e *preadEngine) name() string        { return EnginePread }
func (e *preadEngine) peakInflight() int64 { return e.peak.Load() }
func (e *preadEngine) close()              { close(e.in); e.wg.Wait() }
func (e *preadEngine) pinAll()             {}

func (e *preadEngine) submit(ops []*ioOp) {
	for _, op := range ops {
		e.in <- op
	}
}

func (e *preadEngine) worker() {
	defer e.wg.Done()
	for op := range e.in {
		if n := e.inflight.Add(1); n > e.peak.Load() {
			e.peak.Store(n)
		}
		e.trace.read(op.off, len(op.buf))
		n, err := samplefile.PreadUpTo(e.fd, op.buf, op.off)
		if ft, ok := faults.Inject(faults.DeviceRead, op.path); ok {
			n, err = ft.Apply(n, err, backend.Align)
		}
		op.got = n
		switch {
		case err != nil:
			op.err = err
		case n < len(op.buf):
			op.err = ErrPastEnd
		}
		e.inflight.Add(-1)
		op.grp.finish()
	}
}
