// SPDX-License-Identifier: Apache-2.0

package session

import (
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/nvfeed/nvfeed/bmap"
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
// dataset is looked at: num_shards (at least 1: a client that sends 0
// has not said how many ranks there are), the loader's options
// (loader.Options.Validate: reader arguments, prefetch depth, memory,
// gpu_path with backend), the budget (prefetch_queue_depth when given,
// release_after), device_id, device_uuid's form (the loader's),
// backend_options' size, job_id, fingerprint and a resume state.
// Errors wrap ErrInvalid and name the field, its value and the allowed
// range. Open calls it; the dataset-dependent checks (num_shards at most
// the samples, the state made for this dataset, the fingerprint and the
// job's terms) follow there.
func (p OpenParams) Validate() error {
	// Checked before the loader's defaults, which take 0 for 1.
	if p.NumShards < 1 || p.NumShards > loader.MaxSamples {
		return fmt.Errorf("%w: num_shards %d not in [1, %d]", ErrInvalid, p.NumShards, loader.MaxSamples)
	}
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
	if err := p.checkWebDatasetArgs(); err != nil {
		return err
	}
	if err := checkJobID(p.JobID); err != nil {
		return err
	}
	if err := checkFingerprint(p.Fingerprint); err != nil {
		return err
	}
	if p.State != nil {
		if err := p.State.Validate(); err != nil {
			return fmt.Errorf("%w: state: %w", ErrInvalid, err)
		}
	}
	return nil
}

// checkJobID checks a job_id: "" (no job), or at most MaxJobID bytes of
// UTF-8 without control characters (it appears in messages and logs).
func checkJobID(id string) error {
	switch {
	case len(id) > MaxJobID:
		return fmt.Errorf("%w: job_id of %d bytes, at most %d", ErrInvalid, len(id), MaxJobID)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: job_id %q is not UTF-8", ErrInvalid, id)
	}
	for _, r := range id {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: job_id %q has a control character (%U)", ErrInvalid, id, r)
		}
	}
	return nil
}

// checkFingerprint checks an expected dataset fingerprint: "" (none) or
// bmap.FingerprintLen lowercase hex digits, as an open response gives.
func checkFingerprint(f string) error {
	if f == "" {
		return nil
	}
	ok := len(f) == bmap.FingerprintLen
	for i := 0; ok && i < len(f); i++ {
		ok = f[i] >= '0' && f[i] <= '9' || f[i] >= 'a' && f[i] <= 'f'
	}
	if !ok {
		return fmt.Errorf("%w: fingerprint %.64q is not %d lowercase hex digits (what an open response or GET /v1/datasets gives)", ErrInvalid, f, bmap.FingerprintLen)
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
	var prefetch int // 0: the default
	if p.PrefetchQueueDepth != nil {
		prefetch = *p.PrefetchQueueDepth
	}
	return loader.Options{ReaderArgs: p.ReaderArgs, PrefetchQueueDepth: prefetch, Memory: p.Memory, Device: p.Device,
		DeviceUUID: p.DeviceUUID, GPUPath: p.GPUPath, Backend: p.Backend, BackendOptions: p.BackendOptions, State: p.State}
}
