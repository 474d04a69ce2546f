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

// WebDataset is a webdataset map seen through an ext selection
// (wds.View), shared by every loader over it: the view's bitmap, and
// its largest samples' rooms (wds.View.LargestRooms, from the map's
// index) that size a slot for any batch size. A loader over it
// (Options.WebDataset) reads the view's samples, each its Outputs()
// components, as byte ranges of the tars (the map's Shards, which is
// the map the loader and its backend are opened over). Safe for
// concurrent use.
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

// SlotBytes returns the slot size that holds any batch of batchSize
// samples: the batchSize largest samples' rooms (padding repeats a
// sample without a room of its own), or a little more (a bound from the
// map's index: wds.View.LargestRooms).
func (w *WebDataset) SlotBytes(batchSize int) int64 {
	return max(w.view.LargestRooms(batchSize), backend.Align)
}

// planWebDataset lays a webdataset batch out in its slot: each distinct
// sample's K outputs in rooms of their own (room's rule: 4 KiB-aligned,
// its bytes at its phase in the tar), read as byte ranges of the tar
// (backend.Request.Index is the tar's index in the Shards map the
// backend was opened over, Request.Whole its record, Request.Sample a
// copy with the member's Offset and Size); an empty output
// has length 0 and no room; a repeated (padding) sample shares its first
// copy's rooms. Offsets and Lengths are sample-major, K a sample. A
// corrupt map record fails the batch.
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

// shardsOf returns the tar (an index into the loader's map) each
// position of idx reads from, -1 where its record cannot be read (the
// plan then fails the batch): what Options.Access is asked about.
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

// markFailedWebDataset is markFailed for a webdataset batch: a failed
// request fails its sample (and its repeats): all K lengths 0, its
// position listed once.
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

// Output returns a view of output k of sample i of a webdataset batch in
// host batch memory (as Sample; its length 0 for an empty output or a
// failed sample).
func (b *Batch) Output(i, k int) []byte {
	n := len(b.Offsets) / max(len(b.Indices), 1)
	off := b.Offsets[i*n+k] - b.base
	return b.mem[off : off+b.Lengths[i*n+k] : off+b.Lengths[i*n+k]]
}

// memberError names sample si of the selection in se, a failed read of
// its tar (se names the tar by its index among the shards): the sample's
// position in the selection, and the tar. Not its key: a member's name
// is the tar's content, which a caller refused the tar may not learn.
func memberError(si int, se *backend.SampleError) error {
	e := *se
	e.Index = si
	e.Path = "a member of " + se.Path
	return &e
}
