// SPDX-License-Identifier: Apache-2.0

package uring

import "errors"

// ErrUnsupported is returned (wrapped) when the kernel or a seccomp policy
// (Docker's default profile) refuses io_uring.
var ErrUnsupported = errors.New("io_uring not available")

// ErrFlags is returned (wrapped) when the kernel refuses a setup flag
// (older kernels): set the ring up without it.
var ErrFlags = errors.New("io_uring setup flag not supported")
