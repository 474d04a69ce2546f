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

// ErrInternal is returned (wrapped) by Next once the loader has failed
// from a bug rather than bad input (a recovered panic): the message names
// the cause, and the loader delivers nothing more.
var ErrInternal = errors.New("loader: internal failure")
