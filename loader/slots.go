// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"container/heap"
	"slices"
	"sync"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// SlotBytes returns the slot size that holds any batch of m: the sum of
// the batchSize largest rooms, a sample's room being its phase (a
// tensor's data offset modulo backend.Align) plus its size rounded up to
// backend.Align (room). Padding
// repeats a sample without reading it again, so a ragged batch never holds
// more; a dense batch (Batch.Dense) gives each repeat a row of its own and
// is placed dense only where its rows fit (batchmem.Desc.PacksAt), which a
// dataset of one sample size always does.
func SlotBytes(m *bmap.Map, batchSize int) int64 {
	// The batchSize largest in a min-heap: one pass, no copy of every size
	// (it runs at every session open, over datasets of millions).
	top := make(minHeap, 0, min(batchSize, len(m.Samples)))
	for i := range m.Samples {
		_, n := room(&m.Samples[i])
		top.keep(n)
	}
	return max(top.sum(), backend.Align)
}

// room returns where sample s's bytes start in its room in a ragged
// batch (its phase: the data's offset in its file modulo backend.Align, so
// that whole blocks of the file land in place) and the room's size,
// AlignUp(phase+Size). An empty sample has an empty room.
func room(s *bmap.Sample) (at, size int64) {
	if s.Size == 0 {
		return 0, 0
	}
	at = s.Offset % backend.Align
	return at, backend.AlignUp(at + s.Size)
}

// minHeap is a container/heap of sizes, smallest first: the cap(h)
// largest sizes seen, kept in one pass (keep), with no copy of every size.
type minHeap []int64

// keep adds n if h is not full, else puts it in place of the smallest
// kept when n is larger.
func (h *minHeap) keep(n int64) {
	switch {
	case len(*h) < cap(*h):
		heap.Push(h, n)
	case len(*h) > 0 && n > (*h)[0]:
		(*h)[0] = n
		heap.Fix(h, 0)
	}
}

// sum is the kept sizes' sum.
func (h minHeap) sum() int64 {
	var s int64
	for _, n := range h {
		s += n
	}
	return s
}

func (h minHeap) Len() int           { return len(h) }
func (h minHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h minHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *minHeap) Push(x any)        { *h = append(*h, x.(int64)) }
func (h *minHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// denseRow returns the size and phase of every row when rows samples
// are placed dense in memory d; else 0, 0. The phase is the data's offset
// in its file modulo backend.Align. sample(i) gives the i-th of n
// samples, nil for one that does not count (a refused sample's row stays
// zeroed). Dense needs samples of one size > 0, of a tensor map one
// dtype, shape and phase too. The memory must pack them
// (batchmem.Kind.PacksFiles, batchmem.Desc.PacksAt).
func denseRow(m *bmap.Map, d batchmem.Desc, rows, n int, sample func(i int) *bmap.Sample) (row, lead int64) {
	tensors := m.Reader == bmap.ReaderNumpy
	if !tensors && !d.Kind.PacksFiles() {
		return 0, 0
	}
	var s0 *bmap.Sample
	for i := range n {
		s := sample(i)
		switch {
		case s == nil:
		case s0 == nil:
			s0, row, lead = s, s.Size, s.Offset%backend.Align
		case s.Size != row || (tensors && (s.Offset%backend.Align != lead || !sameTensor(s.Tensor, s0.Tensor))):
			return 0, 0
		}
	}
	if !tensors {
		lead = 0 // a whole file starts at its first byte
	}
	if s0 == nil || !d.PacksAt(rows, row, lead) {
		return 0, 0
	}
	return row, lead
}

// sameTensor reports whether a and b have the same dtype and shape.
func sameTensor(a, b *bmap.Tensor) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.DType == b.DType && slices.Equal(a.Shape, b.Shape)
}

// maxSlotSizes bounds the batch sizes a SlotSizes keeps: past it, a plan
// works out its own.
const maxSlotSizes = 64

// SlotSizes keeps SlotBytes of one map by batch size, for the plans
// given it (Options.SlotSizes): the first plan of a batch size works it
// out while the others wait. It keeps at most maxSlotSizes batch sizes,
// for the last map asked about. Its zero value is ready; it is safe for
// concurrent use.
type SlotSizes struct {
	mu sync.Mutex
	m  *bmap.Map
	by map[int]int64
}

// slotBytes returns SlotBytes(m, batch), kept by s (s nil: worked out).
func (s *SlotSizes) slotBytes(m *bmap.Map, batch int) int64 {
	if s == nil {
		return SlotBytes(m, batch)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m != m {
		s.m, s.by = m, nil
	}
	if n, ok := s.by[batch]; ok {
		return n
	}
	n := SlotBytes(m, batch)
	if s.by == nil {
		s.by = map[int]int64{}
	}
	if len(s.by) < maxSlotSizes {
		s.by[batch] = n
	}
	return n
}
