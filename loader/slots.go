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

// SlotBytes returns the slot size for any batch of m: the batchSize largest rooms summed.
// Padding repeats a sample without a room, so a ragged batch never holds more.
// A dense batch is placed dense only where its rows fit.
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

// room returns sample s's phase in its ragged room and the room's size, AlignUp(phase+Size).
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

// denseRow returns the size and phase of every row when rows samples are dense in d; else 0, 0.
// sample(i) gives the i-th sample, nil for one that does not count.
// Dense needs one size > 0, and for tensors one dtype, shape and phase; d must pack them.
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

// SlotSizes keeps SlotBytes of one map by batch size; later plans wait for the first.
// It keeps at most maxSlotSizes sizes. Its zero value is ready and safe for concurrent use.
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
