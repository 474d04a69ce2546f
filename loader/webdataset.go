// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"errors"
	"fmt"
	"slices"

	"github.com/nvfeed/nvfeed/bmap/wds"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// ErrWebDataset is wrapped by the errors of a webdataset selection a
// loader cannot serve.
var ErrWebDataset = errors.New("webdataset")

// WebDataset is a webdataset map seen through an ext selection, shared by its loaders.
// A loader over it reads each sample's components as byte ranges of the tars.
// Safe for concurrent use.
type WebDataset struct {
	view *wds.View
}

// NewWebDataset prepares view for loaders. It reads no record: the
// map's index, made when the map was checked, sizes the slots.
func NewWebDataset(view *wds.View) (*WebDataset, error) {
	if wds.RoomAlign != backend.Align || wds.MaxRooms < MaxBatchSize {
		return nil, fmt.Errorf("loader: %w: wds rooms of %d bytes, %d kept, for batches aligned to %d of up to %d samples", ErrWebDataset, wds.RoomAlign, wds.MaxRooms, backend.Align, MaxBatchSize)
	}
	return &WebDataset{view: view}, nil
}

// View returns the selection.
func (w *WebDataset) View() *wds.View { return w.view }

// Outputs returns K, each sample's outputs.
func (w *WebDataset) Outputs() int { return w.view.Outputs() }

// SlotBytes returns the slot size for any batch of batchSize samples, from the map's index.
func (w *WebDataset) SlotBytes(batchSize int) int64 {
	return max(w.view.LargestRooms(batchSize), backend.Align)
}

// planWebDataset lays a webdataset batch out in its slot.
// Each distinct sample's K outputs get rooms of their own, read as byte ranges of the tar.
// An empty output has no room; a padding repeat shares its first copy's rooms.
// Offsets and Lengths are sample-major. A corrupt map record fails the batch.
func (l *Loader) planWebDataset(b *Batch, idx []int32) error {
	w := l.opts.WebDataset
	m, k := w.view.Map(), w.Outputs()
	b.members, b.reqPos = b.members[:0], b.reqPos[:0]
	base, slot := b.base, b.mem
	var off int64
	for i, si := range idx {
		if i > 0 && si == idx[i-1] {
			b.Offsets = append(b.Offsets, b.Offsets[len(b.Offsets)-k:]...)
			b.Lengths = append(b.Lengths, b.Lengths[len(b.Lengths)-k:]...)
			continue
		}
		s, err := w.view.Sample(int(si), b.comps)
		if err != nil {
			return fmt.Errorf("sample %d: %w", si, err)
		}
		tar := &l.m.Samples[s.Shard]
		if err := b.deniedAt(i); err != nil {
			// Its tar is refused: empty outputs, nothing of its members'
			// sizes or places, one request (not read) that fails it.
			for range b.comps {
				b.Offsets, b.Lengths = append(b.Offsets, base+off), append(b.Lengths, 0)
			}
			b.reqs, b.reqPos = append(b.reqs, backend.Request{Index: s.Shard, Sample: tar, Whole: tar, Err: err}), append(b.reqPos, int32(i))
			continue
		}
		for _, j := range b.comps {
			if j < 0 {
				b.Offsets, b.Lengths = append(b.Offsets, base+off), append(b.Lengths, 0)
				continue
			}
			c, err := m.Component(s, j)
			if err != nil {
				return fmt.Errorf("sample %d: %w", si, err)
			}
			b.members = append(b.members, *tar)
			ms := &b.members[len(b.members)-1]
			ms.Offset, ms.Size = c.Offset, c.Size
			at, n := room(ms)
			b.Offsets, b.Lengths = append(b.Offsets, base+off+at), append(b.Lengths, c.Size)
			if c.Size == 0 {
				continue
			}
			r := backend.Request{Index: s.Shard, Sample: ms, Whole: tar, At: at}
			if slot != nil {
				r.Buf = slot[off : off+n : off+n]
			}
			if b.dev != 0 {
				r.Dev, r.DevRoom = b.dev+uintptr(off+at), n-at
			}
			b.reqs, b.reqPos = append(b.reqs, r), append(b.reqPos, int32(i))
			off += n
		}
	}
	b.place = batchmem.Ragged(off)
	return nil
}

// shardsOf returns the tar each position of idx reads from, -1 where its record is unreadable.
func (l *Loader) shardsOf(b *Batch, idx []int32) []int {
	if l.opts.Access == nil {
		return nil
	}
	keys := make([]int, len(idx))
	for i, si := range idx {
		keys[i] = -1
		if s, err := l.opts.WebDataset.view.Sample(int(si), b.comps); err == nil {
			keys[i] = s.Shard
		}
	}
	return keys
}

// markFailedWebDataset fails a failed request's sample and its repeats: all K lengths 0.
func (l *Loader) markFailedWebDataset(b *Batch) bool {
	k := l.opts.WebDataset.Outputs()
	for q, r := range b.reqs {
		if r.Err == nil {
			continue
		}
		var se *backend.SampleError
		if !errors.As(r.Err, &se) {
			return false
		}
		si := b.Indices[b.reqPos[q]]
		if slices.ContainsFunc(b.Failed, func(i int) bool { return b.Indices[i] == si }) {
			continue // another of its outputs already failed it: one error a sample
		}
		b.Errors = append(b.Errors, memberError(int(si), se))
		for i, idx := range b.Indices {
			if idx != si || slices.Contains(b.Failed, i) {
				continue
			}
			clear(b.Lengths[i*k : (i+1)*k])
			b.Failed = append(b.Failed, i)
		}
	}
	return len(b.Errors) > 0
}

// Output returns output k of sample i of a webdataset batch in host batch memory.
func (b *Batch) Output(i, k int) []byte {
	n := len(b.Offsets) / max(len(b.Indices), 1)
	off := b.Offsets[i*n+k] - b.base
	return b.mem[off : off+b.Lengths[i*n+k] : off+b.Lengths[i*n+k]]
}

// memberError names sample si's position in the selection and its tar, not its key.
// A member's name is the tar's content, which a refused caller may not learn.
func memberError(si int, se *backend.SampleError) error {
	e := *se
	e.Index = si
	e.Path = "a member of " + se.Path
	return &e
}
