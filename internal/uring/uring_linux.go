// SPDX-License-Identifier: Apache-2.0

// Package uring is the small part of io_uring the loader needs, written
// over golang.org/x/sys/unix. It has a ring of fixed size, READ submissions
// into caller-owned memory outside the Go heap, registered buffers
// (READ_FIXED), and completion reaping.
//
// A Ring is not safe for concurrent use: one goroutine owns it. A ring set
// up with SingleIssuer must be created, registered with, submitted to and
// reaped from one OS thread (runtime.LockOSThread).
package uring

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000

	pageSize       = 4096
	featSingleMmap = 1 << 0
	enterGetEvents = 1 << 0
	opReadFixed    = 4  // IORING_OP_READ_FIXED
	opRead         = 22 // IORING_OP_READ

	setupSingleIssuer = 1 << 12 // IORING_SETUP_SINGLE_ISSUER
	setupDeferTaskrun = 1 << 13 // IORING_SETUP_DEFER_TASKRUN

	registerBuffers       = 0  // IORING_REGISTER_BUFFERS
	registerBuffers2      = 15 // IORING_REGISTER_BUFFERS2 (Linux 5.13)
	registerBuffersUpdate = 16 // IORING_REGISTER_BUFFERS_UPDATE (Linux 5.13)
	rsrcRegisterSparse    = 1  // IORING_RSRC_REGISTER_SPARSE (Linux 5.19)

	// MaxBuffer is the largest buffer the kernel registers (1 GiB);
	// RegisterBuffers splits larger regions.
	MaxBuffer = 1 << 30
	// DeferChunk is the piece DeferBuffers registers on first use: a
	// read pins the pieces it lands in, not its whole region.
	DeferChunk = 4 << 20
	maxBuffers = 1 << 14 // the kernel's limit on a ring's buffers
)

// Options choose how a ring is set up.
type Options struct {
	// SingleIssuer sets IORING_SETUP_SINGLE_ISSUER|DEFER_TASKRUN: only the
	// creating thread submits, and completion work runs when that thread
	// waits for completions instead of interrupting it.
	SingleIssuer bool
}

type sqOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type params struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqOffsets
	cqOff                                                                  cqOffsets
}

// SQE is a submission queue entry (struct io_uring_sqe).
type sqe struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	rwFlags     uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFdIn  int32
	addr3       uint64
	pad         uint64
}

// CQE is a completion (struct io_uring_cqe).
type CQE struct {
	UserData uint64 // what the submission carried
	Res      int32  // bytes read, or -errno
	Flags    uint32
}

// Ring is one io_uring instance.
type Ring struct {
	fd             int
	sqMem, cqMem   []byte
	sqesMem        []byte
	sqHead, sqTail *uint32
	sqMask         uint32
	sqArray        []uint32
	sqes           []sqe
	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           []CQE
	entries        uint32
	pendingSubmit  uint32
	localTail      uint32
	bufs           [][]byte // registered (or deferred) buffers, by index
	// byAddr is bufs' indexes by start address, starts their addresses:
	// what PrepRead searches.
	byAddr []int
	starts []uint64
	// pinned says which of bufs are registered; nil: all of them
	// (RegisterBuffers). DeferBuffers registers each on first use.
	pinned []bool
	// deferErr is the first failed registration of a deferred buffer,
	// until TakeDeferErr; that buffer is read with plain READ.
	deferErr error
}

// rsrcRegister is struct io_uring_rsrc_register.
type rsrcRegister struct {
	nr, flags uint32
	resv2     uint64
	data      uint64
	tags      uint64
}

// rsrcUpdate2 is struct io_uring_rsrc_update2.
type rsrcUpdate2 struct {
	offset, resv uint32
	data, tags   uint64
	nr, resv2    uint32
}

// New sets up a ring with room for entries submissions.
func New(entries uint32) (*Ring, error) { return NewWith(entries, Options{}) }

// NewWith sets up a ring with room for entries submissions, as o says.
func NewWith(entries uint32, o Options) (*Ring, error) {
	var p params
	if o.SingleIssuer {
		p.flags |= setupSingleIssuer | setupDeferTaskrun
	}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno == unix.EINVAL && o.SingleIssuer {
		return nil, fmt.Errorf("uring: setup SINGLE_ISSUER|DEFER_TASKRUN (Linux 6.1+): %w: %w", ErrFlags, errno)
	}
	if errno != 0 {
		if errno == unix.ENOSYS || errno == unix.EPERM || errno == unix.EACCES {
			return nil, fmt.Errorf("uring: setup: %w: %w", ErrUnsupported, errno)
		}
		return nil, fmt.Errorf("uring: setup: %w", errno)
	}
	r := &Ring{fd: int(fd), entries: p.sqEntries}
	if err := r.mmap(&p); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Ring) mmap(p *params) error {
	sqSize := int(p.sqOff.array + p.sqEntries*4)
	cqSize := int(p.cqOff.cqes + p.cqEntries*uint32(unsafe.Sizeof(CQE{})))
	single := p.features&featSingleMmap != 0
	if single {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	r.sqMem, err = unix.Mmap(r.fd, offSQRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("uring: mmap sq: %w", err)
	}
	if single {
		r.cqMem = r.sqMem
	} else if r.cqMem, err = unix.Mmap(r.fd, offCQRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fmt.Errorf("uring: mmap cq: %w", err)
	}
	sqesSize := int(p.sqEntries) * int(unsafe.Sizeof(sqe{}))
	if r.sqesMem, err = unix.Mmap(r.fd, offSQEs, sqesSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fmt.Errorf("uring: mmap sqes: %w", err)
	}
	u32 := func(mem []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
	r.sqHead, r.sqTail = u32(r.sqMem, p.sqOff.head), u32(r.sqMem, p.sqOff.tail)
	r.sqMask = *u32(r.sqMem, p.sqOff.ringMask)
	r.sqArray = unsafe.Slice(u32(r.sqMem, p.sqOff.array), p.sqEntries)
	r.sqes = unsafe.Slice((*sqe)(unsafe.Pointer(&r.sqesMem[0])), p.sqEntries)
	r.cqHead, r.cqTail = u32(r.cqMem, p.cqOff.head), u32(r.cqMem, p.cqOff.tail)
	r.cqMask = *u32(r.cqMem, p.cqOff.ringMask)
	r.cqes = unsafe.Slice((*CQE)(unsafe.Pointer(&r.cqMem[p.cqOff.cqes])), p.cqEntries)
	r.localTail = atomic.LoadUint32(r.sqTail)
	return nil
}

// Entries returns the submission queue size.
func (r *Ring) Entries() uint32 { return r.entries }

// SQSpace returns how many more submissions fit before Submit.
func (r *Ring) SQSpace() uint32 {
	return r.entries - (r.localTail - atomic.LoadUint32(r.sqHead))
}

// RegisterBuffers registers memory with the ring, pinned once: later
// reads into it are READ_FIXED, with no page pinning per request. Each
// buffer must live outside the Go heap and stay mapped until Close;
// regions over MaxBuffer are split. Registering pins every page now.
func (r *Ring) RegisterBuffers(bufs [][]byte) error {
	split := splitBuffers(bufs, MaxBuffer)
	if len(split) == 0 {
		return nil
	}
	if len(split) > maxBuffers {
		return fmt.Errorf("uring: register %d buffers: more than the kernel's %d", len(split), maxBuffers)
	}
	iov := make([]unix.Iovec, len(split))
	for i, b := range split {
		iov[i].Base = &b[0]
		iov[i].SetLen(len(b))
	}
	if err := r.register(registerBuffers, unsafe.Pointer(&iov[0]), len(iov)); err != nil {
		return fmt.Errorf("uring: register %d buffers: %w", len(iov), err)
	}
	r.setBufs(split)
	return nil
}

// DeferBuffers registers memory with the ring as RegisterBuffers does, but
// pins nothing now. It sets up a sparse table with a place for each
// piece of DeferChunk bytes (larger where the kernel's 16384 places would
// not hold them). PrepRead registers, and so pins, a piece the first time
// a read lands in it: a region read in part is pinned in part. A read
// across two pieces, or into a piece whose registration failed, is a
// plain READ; TakeDeferErr says why one failed. Kernels before 5.19
// refuse a sparse table. The error then wraps ErrUnsupported, and
// RegisterBuffers still works there.
func (r *Ring) DeferBuffers(bufs [][]byte) error {
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	chunk := min(MaxBuffer, max(DeferChunk, (total/maxBuffers+pageSize)&^(pageSize-1)))
	split := splitBuffers(bufs, chunk)
	if len(split) == 0 {
		return nil
	}
	if len(split) > maxBuffers {
		return fmt.Errorf("uring: defer %d buffers: more than the kernel's %d", len(split), maxBuffers)
	}
	reg := rsrcRegister{nr: uint32(len(split)), flags: rsrcRegisterSparse}
	if err := r.register(registerBuffers2, unsafe.Pointer(&reg), int(unsafe.Sizeof(reg))); err != nil {
		if err == unix.EINVAL || err == unix.ENOSYS {
			return fmt.Errorf("uring: sparse table of %d buffers (Linux 5.19+): %w: %w", len(split), ErrUnsupported, err)
		}
		return fmt.Errorf("uring: sparse table of %d buffers: %w", len(split), err)
	}
	r.setBufs(split)
	r.pinned = make([]bool, len(split))
	return nil
}

// PinDeferred registers every deferred buffer not registered yet (as
// their first reads would); a refusal is kept for TakeDeferErr.
func (r *Ring) PinDeferred() {
	for i, b := range r.bufs {
		if r.pinned != nil && !r.pinned[i] && len(b) > 0 {
			r.pin(i)
		}
	}
}

// TakeDeferErr returns the first failed registration of a deferred
// buffer since the last call, nil if none.
func (r *Ring) TakeDeferErr() error {
	err := r.deferErr
	r.deferErr = nil
	return err
}

// pin registers deferred buffer i, pinning its pages; false when the
// kernel refuses (the buffer is then never tried again).
func (r *Ring) pin(i int) bool {
	b := r.bufs[i]
	iov := unix.Iovec{Base: &b[0]}
	iov.SetLen(len(b))
	up := rsrcUpdate2{offset: uint32(i), data: uint64(uintptr(unsafe.Pointer(&iov))), nr: 1}
	err := r.register(registerBuffersUpdate, unsafe.Pointer(&up), int(unsafe.Sizeof(up)))
	runtime.KeepAlive(&iov)
	if err != nil {
		if r.deferErr == nil {
			r.deferErr = fmt.Errorf("uring: register buffer %d (%d bytes): %w", i, len(b), err)
		}
		r.bufs[i] = nil // never matched again: plain READ
		return false
	}
	r.pinned[i] = true
	return true
}

// setBufs takes split as the ring's buffers, indexed by address.
func (r *Ring) setBufs(split [][]byte) {
	r.bufs = split
	r.byAddr = make([]int, len(split))
	for i := range r.byAddr {
		r.byAddr[i] = i
	}
	addr := func(i int) uint64 { return uint64(uintptr(unsafe.Pointer(&split[i][0]))) }
	slices.SortFunc(r.byAddr, func(a, b int) int { return cmp.Compare(addr(a), addr(b)) })
	r.starts = make([]uint64, len(split))
	for k, i := range r.byAddr {
		r.starts[k] = addr(i)
	}
}

// find returns the index of the buffer holding [addr, addr+n), or -1
// where none does (or its registration failed).
func (r *Ring) find(addr, n uint64) int {
	k, found := slices.BinarySearch(r.starts, addr)
	if !found {
		k-- // the last buffer starting before addr
	}
	if k < 0 {
		return -1
	}
	i := r.byAddr[k]
	if addr+n > r.starts[k]+uint64(len(r.bufs[i])) { // past it, or refused (nil)
		return -1
	}
	return i
}

// splitBuffers splits regions into pieces of at most size bytes,
// dropping empty ones.
func splitBuffers(bufs [][]byte, size int) [][]byte {
	var split [][]byte
	for _, b := range bufs {
		for len(b) > 0 {
			n := min(len(b), size)
			split = append(split, b[:n])
			b = b[n:]
		}
	}
	return split
}

func (r *Ring) register(op uintptr, arg unsafe.Pointer, n int) error {
	for {
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), op, uintptr(arg), uintptr(n), 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return errno
		}
		return nil
	}
}

// PrepRead queues a read of len(buf) bytes at off from fd into buf. buf
// must not move until the completion arrives: it must live outside the Go
// heap (mmap'd memory). A buf inside a registered buffer is read with
// READ_FIXED; inside a deferred one (DeferBuffers) not registered yet,
// that buffer is registered first. It returns false when the queue is
// full.
func (r *Ring) PrepRead(fd int, buf []byte, off uint64, userData uint64) bool {
	if r.SQSpace() == 0 {
		return false
	}
	idx := r.localTail & r.sqMask
	e := &r.sqes[idx]
	*e = sqe{opcode: opRead, fd: int32(fd), off: off, len: uint32(len(buf)), userData: userData}
	if len(buf) > 0 {
		e.addr = uint64(uintptr(unsafe.Pointer(&buf[0])))
		if i := r.find(e.addr, uint64(len(buf))); i >= 0 && (r.pinned == nil || r.pinned[i] || r.pin(i)) {
			e.opcode, e.bufIndex = opReadFixed, uint16(i)
		}
	}
	r.sqArray[idx] = idx
	r.localTail++
	r.pendingSubmit++
	return true
}

// Submit publishes queued submissions and waits until at least
// waitFor completions are available.
func (r *Ring) Submit(waitFor uint32) error {
	atomic.StoreUint32(r.sqTail, r.localTail)
	var flags uintptr
	if waitFor > 0 {
		flags = enterGetEvents
	}
	for {
		n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(r.pendingSubmit), uintptr(waitFor), flags, 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno == unix.EAGAIN || errno == unix.EBUSY {
			// Completion queue pressure: reap first, then retry.
			return fmt.Errorf("uring: enter: %w", errno)
		}
		if errno != 0 {
			return fmt.Errorf("uring: enter: %w", errno)
		}
		r.pendingSubmit -= uint32(n)
		return nil
	}
}

// Reap calls fn for each available completion and returns how many there
// were.
func (r *Ring) Reap(fn func(CQE)) int {
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail)
	n := 0
	for ; head != tail; head++ {
		fn(r.cqes[head&r.cqMask])
		n++
	}
	atomic.StoreUint32(r.cqHead, head)
	return n
}

// Close releases the ring. Reads still in flight may write their buffers
// until they complete: callers reap every completion first.
func (r *Ring) Close() error {
	if r.sqesMem != nil {
		unix.Munmap(r.sqesMem)
	}
	if r.cqMem != nil && (r.sqMem == nil || &r.cqMem[0] != &r.sqMem[0]) {
		unix.Munmap(r.cqMem)
	}
	if r.sqMem != nil {
		unix.Munmap(r.sqMem)
	}
	r.sqesMem, r.cqMem, r.sqMem = nil, nil, nil
	return unix.Close(r.fd)
}
