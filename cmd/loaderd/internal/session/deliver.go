// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/nvfeed/nvfeed/loader"
)

// Next releases the given slots, then returns the next batch or the end of the epoch.
// With at it returns that batch instead, and the session goes on from there.
// A client holding every slot, or streaming, gets ErrBusy.
func (m *Manager) Next(ctx context.Context, c Caller, id string, release []int, at *Position) (Delivery, error) {
	var d Delivery
	if err := checkRequest(release, at); err != nil {
		return d, err
	}
	err := m.with(c, id, func(ss *session) error {
		if ss.streaming() {
			return fmt.Errorf("%w: session %s is streaming its batches", ErrBusy, ss.id)
		}
		for _, slot := range release {
			if err := ss.release(slot); err != nil {
				return err
			}
		}
		ss.heldMu.Lock()
		n := len(ss.held)
		ss.heldMu.Unlock()
		if n >= ss.slots {
			return fmt.Errorf("%w: all %d batch slots of session %s are held: release batches before asking for more", ErrBusy, ss.slots, ss.id)
		}
		var err error
		d, err = m.deliver(ctx, ss, at)
		return err
	})
	return d, err
}

// deliver takes the session's next batch (or the one at at) and records it
// as held; ss.mu held.
func (m *Manager) deliver(ctx context.Context, ss *session, at *Position) (Delivery, error) {
	var b *loader.Batch
	var err error
	wctx, stop := ss.waitCtx(ctx) // ends too when the session closes
	defer stop()
	if at != nil {
		b, err = ss.l.NextAt(wctx, at.Epoch, at.Iteration)
	} else {
		b, err = ss.l.Next(wctx)
	}
	if err != nil && ss.closing.Err() != nil {
		return Delivery{}, context.Cause(ss.closing)
	}
	if errors.Is(err, io.EOF) {
		st := ss.l.State()
		return Delivery{EndOfEpoch: true, Epoch: st.Epoch, EpochBatches: ss.l.Sampling().EpochBatches(st.Epoch)}, nil
	}
	if errors.Is(err, loader.ErrOptions) {
		return Delivery{}, fmt.Errorf("%w: session %s: %w", ErrInvalid, ss.id, err)
	}
	if err != nil {
		if ctx.Err() == nil {
			ss.metrics.errors.Inc()
		}
		return Delivery{}, fmt.Errorf("session %s: %w", ss.id, err)
	}
	// Copies: once held, the client may release the batch (even before it
	// knows of it) and the slot's descriptors be rewritten.
	d := Delivery{Epoch: b.Epoch, Iteration: b.Iteration, EpochBatches: ss.l.Sampling().EpochBatches(b.Epoch), Slot: b.Slot,
		Offsets: slices.Clone(b.Offsets), Lengths: slices.Clone(b.Lengths), Labels: slices.Clone(b.Labels),
		Indices: slices.Clone(b.Indices), Failed: slices.Clone(b.Failed)}
	for _, e := range b.Errors {
		d.Errors = append(d.Errors, e.Error())
	}
	d.DType, d.Shapes = ss.ds.tensorsOf(b.Indices)
	if b.Shapes != nil { // regions of interest
		d.Shapes = make([][]int64, len(b.Shapes))
		for i, s := range b.Shapes {
			d.Shapes[i] = slices.Clone(s)
		}
	}
	hideFailed(&d)
	ss.metrics.observe(b)
	ss.heldMu.Lock()
	ss.held[b.Slot] = b
	ss.heldMu.Unlock()
	return d, nil
}

// Stream hands the session's batches to out as each is read, with the ends of epochs.
// It runs until ctx ends, the session closes, or out fails; it returns nil when ctx ended.
// First it releases every delivered batch not in keep.
// The slots bound how far it runs ahead: a batch holds its slot until released.
// One stream per session at a time; delivered batches stay held after it.
func (m *Manager) Stream(ctx context.Context, c Caller, id string, at *Position, keep []int, out func(Delivery) error) error {
	if err := CheckStream(at, keep); err != nil {
		return err
	}
	ss, err := m.lookup(c, id)
	if err != nil {
		return err
	}
	ss.streamMu.Lock()
	if ss.stopStream != nil {
		ss.streamMu.Unlock()
		return fmt.Errorf("%w: session %s is already streaming", ErrBusy, id)
	}
	ctx, cancel := context.WithCancel(ctx)
	ss.stopStream = cancel
	ss.streamMu.Unlock()
	ss.releaseExcept(keep)
	defer func() {
		ss.streamMu.Lock()
		ss.stopStream = nil
		ss.streamMu.Unlock()
		cancel()
		ss.touch() // the idle clock starts again
	}()
	for {
		var d Delivery
		err := m.with(c, id, func(ss *session) error {
			var err error
			d, err = m.deliver(ctx, ss, at)
			return err
		})
		at = nil
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if err := out(d); err != nil {
			return err
		}
	}
}

// Release gives back the batch in slot. It does not wait for a Next or a
// stream step of the same session.
func (m *Manager) Release(c Caller, id string, slot int) error {
	if err := checkSlot("release", slot); err != nil {
		return err
	}
	ss, err := m.lookup(c, id)
	if err != nil {
		return err
	}
	ss.touch()
	return ss.release(slot)
}

// ReleaseExcept gives back every batch the session has delivered except
// those in the slots keep: what a client still holds when its stream ends.
func (m *Manager) ReleaseExcept(c Caller, id string, keep []int) error {
	if err := CheckSlots("keep", keep); err != nil {
		return err
	}
	ss, err := m.lookup(c, id)
	if err != nil {
		return err
	}
	ss.releaseExcept(keep)
	return nil
}

// State returns the position of the session's next batch without waiting for a Next.
func (m *Manager) State(c Caller, id string) (loader.State, error) {
	ss, err := m.lookup(c, id)
	if err != nil {
		return loader.State{}, err
	}
	ss.touch()
	st := ss.l.State()
	st.Content = ss.content
	return st, nil
}

// failedDims is a failed sample's shape on the wire: its length, 0.
var failedDims = []int64{0}

// hideFailed clears a failed sample's label and shape, so it tells nothing of its content.
func hideFailed(d *Delivery) {
	for _, i := range d.Failed {
		if i < len(d.Labels) {
			d.Labels[i] = 0
		}
		if i < len(d.Shapes) {
			d.Shapes[i] = failedDims
		}
	}
}
