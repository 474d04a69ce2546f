// SPDX-License-Identifier: Apache-2.0

package wds

import (
	"container/heap"
	"encoding/binary"
	"fmt"
	"slices"
)

// Selections without a pass over the samples. Whether a selection keeps a sample
// depends only on its components' extensions in tar order: its pattern.
// A map has a handful. Check records per pattern its count, first sample and largest rooms.
// Select then judges each pattern once.

// Bounds of the index.
const (
	// MaxPatterns is the most distinct patterns a map may have (a map
	// with more is refused: no DALI dataset comes near).
	MaxPatterns = 1 << 16
	// MaxRooms is how many of the largest rooms the index keeps per
	// pattern and position: a slot of up to MaxRooms samples is sized
	// from them (loader.MaxBatchSize).
	MaxRooms = 1 << 16
	// RoomAlign is the alignment of a component's room in a batch
	// (loader/backend.Align): its bytes at their phase in the tar, the
	// room rounded up.
	RoomAlign = 4096
)

// pattern is the samples whose components have one sequence of
// extensions.
type pattern struct {
	exts  []uint32  // each component's extension, in tar order
	count int       // samples with it
	first int       // the first of them, in map order
	rooms [][]int64 // per position, the largest rooms, largest first (at most MaxRooms)
}

// index is what Select needs of every sample, made by one pass over
// the records.
type index struct {
	of       []uint32 // each sample's pattern
	patterns []pattern
}

// Room is the room in a batch of a component of size bytes at offset
// in its tar: its phase (offset modulo RoomAlign) and its bytes,
// rounded up to RoomAlign; 0 for an empty one.
func Room(offset, size int64) int64 {
	if size == 0 {
		return 0
	}
	return (offset%RoomAlign + size + RoomAlign - 1) &^ (RoomAlign - 1)
}

// buildIndex reads every record once, checked, and indexes the samples
// by pattern.
func (m *Map) buildIndex() (*index, error) {
	ix := &index{of: make([]uint32, m.nSample)}
	byKey := map[string]uint32{}
	heaps := [][]roomHeap{}
	var key, last []byte
	var exts []uint32
	var rooms []int64
	p := uint32(0)
	for i := range m.nSample {
		s, err := m.Sample(i)
		if err != nil {
			return nil, err
		}
		key, exts, rooms = key[:0], exts[:0], rooms[:0]
		for j := s.First; j < s.First+s.Count; j++ {
			c, err := m.Component(s, j)
			if err != nil {
				return nil, err
			}
			key = binary.LittleEndian.AppendUint32(key, uint32(c.Ext))
			exts = append(exts, uint32(c.Ext))
			rooms = append(rooms, Room(c.Offset, c.Size))
		}
		if i == 0 || string(key) != string(last) {
			var ok bool
			if p, ok = byKey[string(key)]; !ok {
				if len(ix.patterns) >= MaxPatterns {
					return nil, fmt.Errorf("%w: more than %d distinct sequences of component extensions", ErrCorrupt, MaxPatterns)
				}
				p = uint32(len(ix.patterns))
				byKey[string(key)] = p
				ix.patterns = append(ix.patterns, pattern{exts: slices.Clone(exts), first: i})
				heaps = append(heaps, make([]roomHeap, len(exts)))
			}
			last = append(last[:0], key...)
		}
		ix.of[i] = p
		ix.patterns[p].count++
		for k, r := range rooms {
			heaps[p][k].keep(r)
		}
	}
	for p := range ix.patterns {
		rooms := make([][]int64, len(heaps[p]))
		for k, h := range heaps[p] {
			rooms[k] = []int64(h)
			slices.SortFunc(rooms[k], func(a, b int64) int { return cmpDesc(a, b) })
		}
		ix.patterns[p].rooms = rooms
	}
	return ix, nil
}

// cmpDesc orders larger first.
func cmpDesc(a, b int64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// bytes is what the index holds beyond the map.
func (ix *index) bytes() int64 {
	n := int64(4 * len(ix.of))
	for _, p := range ix.patterns {
		n += int64(4*len(p.exts)) + 64
		for _, r := range p.rooms {
			n += int64(8 * len(r))
		}
	}
	return n
}

// roomHeap keeps the MaxRooms largest rooms seen, smallest on top.
type roomHeap []int64

// keep adds n if h holds fewer than MaxRooms, else puts it in place of
// the smallest kept when n is larger.
func (h *roomHeap) keep(n int64) {
	switch {
	case len(*h) < MaxRooms:
		*h = append(*h, n)
		heap.Fix(h, len(*h)-1)
	case n > (*h)[0]:
		(*h)[0] = n
		heap.Fix(h, 0)
	}
}

func (h roomHeap) Len() int           { return len(h) }
func (h roomHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h roomHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *roomHeap) Push(x any)        { *h = append(*h, x.(int64)) }
func (h *roomHeap) Pop() any          { panic("wds: roomHeap only keeps") }

// largest bounds the sum of the n largest rooms of the kept patterns by merging their bounds.
func (ix *index) largest(used [][]int, n int) int64 {
	h := &boundHeap{}
	bound := func(p, k int) (int64, bool) {
		var sum int64
		for _, pos := range used[p] {
			r := ix.patterns[p].rooms[pos]
			if k >= len(r) {
				return 0, false
			}
			sum += r[k]
		}
		return sum, true
	}
	for p := range ix.patterns {
		if len(used[p]) == 0 {
			continue
		}
		if b, ok := bound(p, 0); ok {
			heap.Push(h, boundAt{b, p, 0})
		}
	}
	var sum int64
	for range n {
		if h.Len() == 0 {
			break
		}
		top := heap.Pop(h).(boundAt)
		sum += top.room
		if b, ok := bound(top.p, top.k+1); ok {
			heap.Push(h, boundAt{b, top.p, top.k + 1})
		}
	}
	return sum
}

// boundAt is pattern p's k-th largest room bound.
type boundAt struct {
	room int64
	p, k int
}

// boundHeap is a max-heap of bounds.
type boundHeap []boundAt

func (h boundHeap) Len() int           { return len(h) }
func (h boundHeap) Less(i, j int) bool { return h[i].room > h[j].room }
func (h boundHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *boundHeap) Push(x any)        { *h = append(*h, x.(boundAt)) }
func (h *boundHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
