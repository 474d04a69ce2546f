// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"errors"

	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// ErrOptions is returned (wrapped) for invalid options or state. It is
// backend.ErrOptions, so backends' option errors match it too.
var ErrOptions = backend.ErrOptions

// ErrNoCUDA is returned (wrapped) for GPU memory on a machine without an
// NVIDIA driver (batchmem.ErrNoCUDA).
var ErrNoCUDA = batchmem.ErrNoCUDA

// ErrNoSpace is returned (wrapped) when batch memory cannot be had
// (batchmem.ErrNoSpace).
var ErrNoSpace = batchmem.ErrNoSpace

// ErrClosed is returned by Next after Close.
var ErrClosed = errors.New("loader closed")

// ErrInternal: the loader failed from a bug, not bad input, and delivers nothing more.
var ErrInternal = errors.New("loader: internal failure")

// ErrUnavailable: the cufile path cannot run here; GPUPathAuto then falls back to bounce.
var ErrUnavailable = backend.ErrUnavailable

// ErrNoRaw is returned (wrapped) by a backend that reads the block device
// when the map has none (backend.ErrNoRaw): only the file backend reads it.
var ErrNoRaw = backend.ErrNoRaw

// ErrDevice is returned (wrapped) when the block device cannot be opened
// for raw reads (backend.ErrDevice).
var ErrDevice = backend.ErrDevice

// ErrUnknownGPU: the GPU asked for is not one this process sees.
var ErrUnknownGPU = batchmem.ErrUnknownGPU

// ErrUnsupported is returned (wrapped) for a memory kind this build
// cannot make on this machine (batchmem.ErrUnsupported).
var ErrUnsupported = batchmem.ErrUnsupported
