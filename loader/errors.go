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

// ErrNoSpace is returned (wrapped) by NewRing when the directory for batch
// memory has less room than the ring may use: pages are allocated only as
// batches use them, and a page that cannot be allocated then would kill
// the process (SIGBUS), so the room is checked at open.
var ErrNoSpace = errors.New("no room for batch memory")

// ErrClosed is returned by Next after Close.
var ErrClosed = errors.New("loader closed")
