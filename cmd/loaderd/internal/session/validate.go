// SPDX-License-Identifier: Apache-2.0

package session

import (
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
)

// Bounds on the session numbers a client sends; the loader's request
// (batch_size, shard_id, num_shards, prefetch_queue_depth, release_after,
// device_id, backend_options, epoch, iteration, a state's fields) is
// bounded by package loader (loader.MaxBatchSize, loader.MaxSlots...).
const (
	// MaxSlots is the most batch slots a session has (loader.MaxSlots):
	// slot numbers are in [0, MaxSlots), and a list of slots (release,
	// keep) has at most MaxSlots entries.
	MaxSlots = loader.MaxSlots
	// MaxDevice bounds device_id (loader.MaxDevice).
	MaxDevice = loader.MaxDevice
	// MaxBackendOptions bounds the entries of backend_options
	// (loader.MaxBackendOptions).
	MaxBackendOptions = loader.MaxBackendOptions
)

// Validate checks what an open request carries for the daemon alone,
// before any dataset is looked at: the webdataset arguments, job_id,
// files and fingerprint. Errors wrap ErrInvalid and name the field, its
// value and the allowed form. The loader checks its own request once
// (loader.Request.Options), a resume state among it.
func (p OpenParams) Validate() error {
	if err := p.checkWebDatasetArgs(); err != nil {
		return err
	}
	if err := checkJobID(p.JobID); err != nil {
		return err
	}
	if n := len(p.Files); n > MaxFiles {
		return fmt.Errorf("%w: files has %d names, at most %d", ErrInvalid, n, MaxFiles)
	}
	return checkFingerprint(p.Fingerprint)
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
	if !bmap.IsHex(f, bmap.FingerprintLen) {
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
