// SPDX-License-Identifier: Apache-2.0

package session

import (
	"fmt"

	"github.com/nvfeed/nvfeed/loader"
)

// Bounds on the session numbers a client sends; the sampling numbers
// (batch_size, shard_id, num_shards, epoch, iteration, a state's fields)
// are bounded by package loader (loader.MaxBatchSize, loader.MaxEpoch...).
const (
	// MaxSlots is the most batch slots a session has: prefetched batches,
	// the batches its client holds, and the one just delivered. Slot
	// numbers are in [0, MaxSlots), and a list of slots (release, keep)
	// has at most MaxSlots entries.
	MaxSlots = MaxPrefetch + MaxReleaseAfter + 1
	// MaxDevice bounds device_id: a CUDA device ordinal.
	MaxDevice = 1023
	// MaxBackendOptions bounds the entries of backend_options (no backend
	// has nearly as many options).
	MaxBackendOptions = 64
)

// Validate checks what an open request carries on its own, before any
// dataset is looked at: the loader's options (loader.Options.Validate:
// reader arguments, prefetch depth, memory, gpu_path with backend), the
// budget (release_after), device_id, device_uuid's form (the loader's),
// backend_options' size and a resume
// state.
// Errors wrap ErrInvalid and name the field, its value and the allowed
// range. Open calls it; the dataset-dependent checks (num_shards at most
// the samples, the state made for this dataset) follow there.
func (p OpenParams) Validate() error {
	// The loader's options' defaults and bounds: the reader arguments,
	// the prefetch depth, the memory kind and the GPU path.
	if err := p.loaderOptions().WithDefaults().Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if _, _, _, err := budget(p); err != nil {
		return err
	}
	if p.Device < 0 || p.Device > MaxDevice {
		return fmt.Errorf("%w: device_id %d not in [0, %d]", ErrInvalid, p.Device, MaxDevice)
	}
	if n := len(p.BackendOptions); n > MaxBackendOptions {
		return fmt.Errorf("%w: backend_options has %d entries, at most %d", ErrInvalid, n, MaxBackendOptions)
	}
	if p.State != nil {
		if err := p.State.Validate(); err != nil {
			return fmt.Errorf("%w: state: %w", ErrInvalid, err)
		}
	}
	return nil
}

// Validate checks a requested position: epoch in [0, loader.MaxEpoch],
// iteration in [0, loader.MaxIteration]. Errors wrap ErrInvalid.
func (p Position) Validate() error {
	if err := loader.CheckPosition(p.Epoch, p.Iteration); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// CheckSlots checks a list of slots a client sends (field names it: release,
// keep): at most MaxSlots of them, each in [0, MaxSlots). Errors wrap
// ErrInvalid.
func CheckSlots(field string, slots []int) error {
	if len(slots) > MaxSlots {
		return fmt.Errorf("%w: %s lists %d slots, at most %d", ErrInvalid, field, len(slots), MaxSlots)
	}
	for _, s := range slots {
		if err := checkSlot(field, s); err != nil {
			return err
		}
	}
	return nil
}

// checkSlot checks one slot number: in [0, MaxSlots).
func checkSlot(field string, slot int) error {
	if slot < 0 || slot >= MaxSlots {
		return fmt.Errorf("%w: %s slot %d not in [0, %d)", ErrInvalid, field, slot, MaxSlots)
	}
	return nil
}

// checkRequest checks a next request's numbers: the slots it releases and
// the position it names (nil: none).
func checkRequest(release []int, at *Position) error {
	return checkSlotsAt("release", release, at)
}

// CheckStream checks a stream request's numbers before the stream starts:
// the position it names (nil: none) and the slots it keeps. A transport
// calls it before switching protocols, so a bad request is answered with
// a plain error status; Stream checks again.
func CheckStream(at *Position, keep []int) error {
	return checkSlotsAt("keep", keep, at)
}

// checkSlotsAt checks a list of slots and an optional position.
func checkSlotsAt(field string, slots []int, at *Position) error {
	if err := CheckSlots(field, slots); err != nil {
		return err
	}
	if at != nil {
		return at.Validate()
	}
	return nil
}

// loaderOptions returns the loader options an open request names (the
// budget's slots and what the daemon adds are Open's).
func (p OpenParams) loaderOptions() loader.Options {
	return loader.Options{ReaderArgs: p.ReaderArgs, PrefetchQueueDepth: p.PrefetchQueueDepth, Memory: p.Memory, Device: p.Device,
		DeviceUUID: p.DeviceUUID, GPUPath: p.GPUPath, Backend: p.Backend, BackendOptions: p.BackendOptions, State: p.State}
}
