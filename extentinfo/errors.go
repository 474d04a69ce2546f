// SPDX-License-Identifier: Apache-2.0

package extentinfo

import "errors"

// ErrUnsupportedFS is returned (wrapped) for filesystems whose FIEMAP
// addresses are not offsets on a block device, or that have no block device.
var ErrUnsupportedFS = errors.New("filesystem not supported for raw block access")

// ErrNoFiemap is returned (wrapped) when the filesystem does not implement
// the FIEMAP ioctl.
var ErrNoFiemap = errors.New("FIEMAP not supported")
