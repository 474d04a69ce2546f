// SPDX-License-Identifier: Apache-2.0

package backend

import (
	"errors"
	"fmt"
)

// ErrOptions is returned (wrapped) for invalid options: an unknown
// backend or option, a value of the wrong type or out of its range.
var ErrOptions = errors.New("invalid loader options")

// ErrShortRead is returned (wrapped) when a sample has fewer or more
// bytes than the map says: the file changed since it was mapped.
var ErrShortRead = errors.New("file size differs from the map")

// ErrDevice is returned (wrapped) when the block device cannot be opened
// for raw reads.
var ErrDevice = errors.New("cannot read the block device")

// ErrNoRaw is returned (wrapped) by a backend that reads the block
// device when the map has none: it was made on a filesystem without
// device extents (tmpfs, NFS, overlay, btrfs, …) and only the file
// backend reads it.
var ErrNoRaw = errors.New("no samples readable from a block device")

// SampleError is a failed read of one sample.
type SampleError struct {
	Index int    // sample index in the map
	Path  string // sample path, relative to the dataset root
	Err   error  // the cause
}

// Error returns "sample INDEX (PATH): CAUSE".
func (e *SampleError) Error() string {
	return fmt.Sprintf("sample %d (%s): %v", e.Index, e.Path, e.Err)
}

// Unwrap returns the cause.
func (e *SampleError) Unwrap() error { return e.Err }

// ErrUnavailable is returned (wrapped) by a backend's Open when it cannot
// run on this machine (a library, driver or device it needs is missing,
// or refused): under GPU path auto the host then falls back to bounce.
var ErrUnavailable = errors.New("backend unavailable here")
