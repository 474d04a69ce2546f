// SPDX-License-Identifier: Apache-2.0

package raw

import (
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader/backend"
)

// planner turns a raw sample's extents into aligned device reads. Its
// configuration alone makes it gds-like or bam-like.
type planner struct {
	reqSize uint64      // largest request, or every request's size when fixed
	fixed   bool        // whole reqSize-aligned device blocks (bam)
	cache   *blockCache // serves fixed blocks already read; nil for none
	devPath string
	devSize int64
	sector  uint64 // the device's logical block size (BLKSSZGET); 0 means 512
	fsBlock uint64 // the filesystem's block size; 0 means sector
}

// ownEnd returns the end of the filesystem block holding the device byte
// before end: as far as the file's own blocks surely go (extents are
// whole filesystem blocks).
func (p *planner) ownEnd(end uint64) uint64 {
	if p.fsBlock == 0 {
		return alignUpTo(end, p.sectorSize())
	}
	return alignUpTo(end, p.fsBlock)
}

func (p *planner) sectorSize() uint64 {
	if p.sector == 0 {
		return 512
	}
	return p.sector
}

// segPlan is how one aligned device read reaches its sample.
type segPlan struct {
	op      *ioOp
	dst     []byte // where the sample's bytes go
	src     int    // offset of dst's first byte within op.buf, when bounced
	bounce  bool   // op reads into a bounce buffer; copy after
	block   uint64 // device block number (fixed blocks), for cache insertion
	request int    // index of the request in the batch
}

// ownStart returns the start of the filesystem block holding device byte
// a: the bytes from there to a are the file's own (extents are whole
// filesystem blocks).
func (p *planner) ownStart(a uint64) uint64 {
	if p.fsBlock == 0 {
		return a &^ (p.sectorSize() - 1)
	}
	return a &^ (p.fsBlock - 1)
}

// plan appends request ri's device reads to sc: the sample's bytes go to
// r.Buf[r.At:]. Aligned pieces are read straight into the sample's batch
// memory; pieces whose device offset and memory address disagree modulo
// 4 KiB, or that would spill over a neighbour (another piece, or outside
// Buf: a dense row's neighbours are other rows), go through bounce
// memory. A read may run into the request's own slack, memory the client
// maps, only with the file's own bytes: before the sample's first byte
// (a tensor's header, into Buf[:At]) only from the filesystem block
// holding it, and past its last byte only the rest of the file's last
// filesystem block: a read that would go further is cut at the end of
// the logical block holding that byte (gds), or bounced (bam, whose
// blocks are whole). Holes and unwritten extents become zero ranges;
// cached blocks are copied at once.
func (p *planner) plan(ri int, r *backend.Request, sc *scratch) error {
	s := r.Sample
	sc.segs = s.Segments(sc.segs[:0])
	size := uint64(s.Size)
	step := p.reqSize
	at := uint64(r.At)
	addr := r.Addr()
	for _, g := range sc.segs {
		if g.Zero {
			sc.zeros = append(sc.zeros, r.Buf[at+g.FileOff:at+g.FileOff+g.Len])
			continue
		}
		segEnd := g.DevOff + g.Len
		if int64(segEnd) > p.devSize {
			return &backend.SampleError{Index: r.Index, Path: s.Path, Err: fmt.Errorf("device %s bytes [%d,%d) past the end of the device (%d bytes)", p.devPath, g.DevOff, segEnd, p.devSize)}
		}
		lo := g.DevOff &^ (backend.Align - 1) // reads start at the 4 KiB boundary
		if p.fixed {
			lo = g.DevOff - g.DevOff%step // or at the block's
		}
		for cur := lo; cur < segEnd; {
			end := min(cur+step, alignUpU(segEnd))
			if p.fixed {
				end = cur + step
			}
			o := p.judge(r, g, cur, end, at, addr, size)
			if !o.direct && !p.fixed && o.congruent && o.end-cur > backend.Align {
				// Only the blocks that cannot land in place are bounced: a
				// partial first block (the bytes before it another row's,
				// or another file's) alone, or the read cut before its
				// partial last block.
				if !o.head {
					o = p.judge(r, g, cur, cur+backend.Align, at, addr, size)
				} else if cut := o.z &^ (backend.Align - 1); cut > cur && cut < o.end {
					o = p.judge(r, g, cur, cut, at, addr, size)
				}
			}
			end = o.end
			a, z, fileA := o.a, o.z, o.fileA
			dst := r.Buf[at+fileA : at+fileA+(z-a)]
			block := cur / step
			if p.cache != nil && p.cache.get(block, dst, int(a-cur)) {
				cur = end
				continue
			}
			op := sc.newOp(int64(cur), s.Path)
			pl := segPlan{op: op, dst: dst, request: ri, block: block}
			if o.direct {
				op.buf = r.Buf[o.memStart:o.memEnd:o.memEnd]
			} else {
				buf, err := sc.alloc(int(end - cur))
				if err != nil {
					return &backend.SampleError{Index: r.Index, Path: s.Path, Err: err}
				}
				op.buf = buf[:end-cur]
				pl.bounce, pl.src = true, int(a-cur)
			}
			sc.plans = append(sc.plans, pl)
			sc.ops = append(sc.ops, op)
			cur = end
		}
	}
	return nil
}

// opJudged is how a device read [cur, end) of a segment reaches the
// sample: the part of it that is the segment's, [a, z), at file offset
// fileA of the sample's bytes; and whether it can land in place.
type opJudged struct {
	end              uint64 // the read's end, perhaps cut (the tail's)
	a, z, fileA      uint64
	memStart, memEnd int64 // the read in r.Buf, were it direct
	head             bool  // what it reads before a may land in r.Buf: nothing, or the file's own bytes into the slack before the sample
	congruent        bool  // its memory address is congruent with its device offset modulo Align
	direct           bool
}

// judge says how the device read [cur, end) of segment g of request r
// (its bytes at r.Buf[at:], Buf at address addr, size bytes) reaches it.
// Direct when the aligned range maps onto this sample's own room without
// touching bytes another piece writes: its memory address congruent, and
// the range is whole, or runs only into the slack before the sample's
// first byte or after its last, and only over the file's own block. A
// read running past the sample's last byte and past the file's own block
// is cut at the end of the logical block holding that byte (gds).
func (p *planner) judge(r *backend.Request, g bmap.Segment, cur, end, at uint64, addr uintptr, size uint64) opJudged {
	segEnd := g.DevOff + g.Len
	a, z := max(cur, g.DevOff), min(end, segEnd)
	fileA := g.FileOff + (a - g.DevOff)
	// The read runs on past the sample's last byte: only the rest of the
	// file's own block may follow it.
	tail := z < end && z == segEnd && fileA+(z-a) == size
	if tail && !p.fixed && end > p.ownEnd(z) {
		if cut := alignUpTo(z, p.sectorSize()); cut <= p.ownEnd(z) {
			end = cut
		}
	}
	o := opJudged{end: end, a: a, z: z, fileA: fileA}
	o.memStart = int64(at+fileA) - int64(a-cur)
	o.memEnd = o.memStart + int64(end-cur)
	o.head = a == cur || (fileA == 0 && a-cur <= at && cur >= p.ownStart(a))
	o.congruent = (int64(addr)+o.memStart)%backend.Align == 0
	o.direct = o.memStart >= 0 && o.congruent && o.head &&
		(z == end || (tail && end <= p.ownEnd(z))) && o.memEnd <= int64(len(r.Buf))
	return o
}

func alignUpU(n uint64) uint64 { return (n + backend.Align - 1) &^ (backend.Align - 1) }

// alignUpTo rounds n up to a multiple of a (a power of two).
func alignUpTo(n, a uint64) uint64 { return (n + a - 1) &^ (a - 1) }

// scratch is one batch's planning state, reused across batches so the
// read path does not allocate per request: plans, ops (from slabs of
// ioOps), zero ranges, and bounce memory for reads that cannot land in
// place. Bounce memory is mmap'd, outside the Go heap, as the kernel
// writes it after the submitting call returns (see internal/uring); it is
// freed by free.
type scratch struct {
	how     []readHow // per request of the batch
	shadow  [][]byte  // per request: its bounce room when rawGuarded
	check   []int     // samples whose files are checked after the reads (checkFresh)
	checkAt []int     // the request of each
	segs    []bmap.Segment
	plans   []segPlan
	ops     []*ioOp
	zeros   [][]byte
	slabs   [][]ioOp // a slab never grows, so pointers into it stay valid
	nops    int
	chunks  [][]byte // mmap'd
	cur     int      // chunk in use
	off     int      // next free byte in it
}

const (
	bounceChunk = 1 << 20
	opSlab      = 256
)

// readHow is how a request of a batch is read.
type readHow uint8

const (
	notRaw     readHow = iota // through the filesystem, or not read raw at all (found changed before)
	rawDirect                 // raw, straight into its room in the slot
	rawGuarded                // raw, into bounce memory (scratch.shadow), until its check after the read passes
	rawTrusted                // rawGuarded, checked and copied into its room
)

// prepare sizes the per-request state for a batch of n requests.
func (sc *scratch) prepare(n int) {
	sc.how = slices.Grow(sc.how[:0], n)[:n]
	sc.shadow = slices.Grow(sc.shadow[:0], n)[:n]
	clear(sc.how)
	clear(sc.shadow)
}

// newOp returns a zeroed ioOp for device offset off, for the sample at path.
func (sc *scratch) newOp(off int64, path string) *ioOp {
	slab, i := sc.nops/opSlab, sc.nops%opSlab
	if slab == len(sc.slabs) {
		sc.slabs = append(sc.slabs, make([]ioOp, opSlab))
	}
	sc.nops++
	op := &sc.slabs[slab][i]
	*op = ioOp{off: off, path: path}
	return op
}

// alloc returns n bytes (rounded up to 4 KiB) of page-aligned bounce
// memory, valid until reset.
func (sc *scratch) alloc(n int) ([]byte, error) {
	n = int(backend.AlignUp(int64(n)))
	for {
		if sc.cur < len(sc.chunks) && len(sc.chunks[sc.cur])-sc.off >= n {
			p := sc.chunks[sc.cur][sc.off : sc.off+n : sc.off+n]
			sc.off += n
			return p, nil
		}
		if sc.cur < len(sc.chunks) && sc.off > 0 {
			sc.cur, sc.off = sc.cur+1, 0
			continue
		}
		if sc.cur == len(sc.chunks) || len(sc.chunks[sc.cur]) < n {
			mem, err := unix.Mmap(-1, 0, max(bounceChunk, n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
			if err != nil {
				return nil, fmt.Errorf("bounce memory of %d bytes: %w", max(bounceChunk, n), err)
			}
			if sc.cur == len(sc.chunks) {
				sc.chunks = append(sc.chunks, mem)
			} else {
				unix.Munmap(sc.chunks[sc.cur])
				sc.chunks[sc.cur] = mem
			}
		}
	}
}

// reset forgets the batch (dropping its references to batch memory) and
// keeps the memory for the next.
func (sc *scratch) reset() {
	clear(sc.plans)
	clear(sc.zeros)
	clear(sc.ops)
	clear(sc.shadow)
	sc.plans, sc.ops, sc.zeros = sc.plans[:0], sc.ops[:0], sc.zeros[:0]
	sc.nops, sc.cur, sc.off = 0, 0, 0
}

// free unmaps the bounce memory.
func (sc *scratch) free() error {
	var errs []error
	for _, c := range sc.chunks {
		errs = append(errs, unix.Munmap(c))
	}
	sc.chunks = nil
	return errors.Join(errs...)
}
