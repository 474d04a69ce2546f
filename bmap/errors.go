// SPDX-License-Identifier: Apache-2.0

package bmap

import "errors"

// ErrStale is returned (wrapped) when the live filesystem or file no longer
// matches the map: its extents must not be trusted.
var ErrStale = errors.New("stale block map")

// ErrXNVMe is returned (wrapped) by Decode and Load for a map in the xNVMe
// format, which can only be used together with its dataset root: see
// ImportXNVMe.
var ErrXNVMe = errors.New("map is in xnvme-json format: import it with its mountpoint")

// ErrCorrupt is returned (wrapped) when a map file cannot be decoded or
// fails validation.
var ErrCorrupt = errors.New("corrupt block map")

// errNotRegular is returned for a sample whose symlink leads to something
// other than a regular file.
var errNotRegular = errors.New("not a regular file")

// ErrExtents is wrapped by the error of a sample whose mapped extents are
// not the file's own on the live filesystem: a map that would make a raw
// read return other blocks than the file's. Such a sample is never read
// raw.
var ErrExtents = errors.New("mapped extents are not the file's")

// ErrWebDataset is returned (wrapped) by Decode and Load for a version 3
// map (fn.readers.webdataset's tar shards), which is not decoded into a
// Map: open it in place with bmap/wds.Open.
var ErrWebDataset = errors.New("a webdataset map (version 3): read it with bmap/wds (mkbmap samples lists it)")
