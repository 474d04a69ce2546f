package loader

import (
	"errors"

	"github.com/nvfeed/nvfeed/loader/backend"
)

// ErrOptions is returned (wrapped) for invalid options or state. It is
// backend.ErrOptions, so backends' option errors match it too.
var ErrOptions = backend.ErrOptions

// ErrNoCUDA is returned (wrapped) for MemoryGPU on a machine without an
// NVIDIA driver.
var ErrNoCUDA = errors.New("no CUDA driver found")

// ErrClosed is returned by Next after Close.
var ErrClosed = errors.New("loader closed")
