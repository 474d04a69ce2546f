// SPDX-License-Identifier: Apache-2.0

// Package extentinfo maps files to the byte ranges of their block device that hold them.
// It wraps the FIEMAP ioctl and resolves a filesystem to its device through sysfs.
// FIEMAP offsets are relative to a partition: add Device.PartitionStart for the whole disk.
package extentinfo

import (
	"fmt"
	"strings"
)

// FIEMAP extent flags, as defined in linux/fiemap.h.
const (
	FlagLast          uint32 = 0x0001 // last extent of the file
	FlagUnknown       uint32 = 0x0002 // data location unknown
	FlagDelalloc      uint32 = 0x0004 // location still pending (delayed allocation)
	FlagEncoded       uint32 = 0x0008 // data is compressed or otherwise encoded
	FlagDataEncrypted uint32 = 0x0080 // data is encrypted
	FlagNotAligned    uint32 = 0x0100 // extent offsets may not be block aligned
	FlagDataInline    uint32 = 0x0200 // data is stored inside the metadata block
	FlagDataTail      uint32 = 0x0400 // data is packed with other files' tails
	FlagUnwritten     uint32 = 0x0800 // space allocated but not written: reads as zeros
	FlagMerged        uint32 = 0x1000 // extent merged from block-mapped ranges
	FlagShared        uint32 = 0x2000 // space shared with other files (reflink)
)

// flagNames lists every known flag in bit order, for String.
var flagNames = [...]struct {
	bit  uint32
	name string
}{
	{FlagLast, "last"}, {FlagUnknown, "unknown"}, {FlagDelalloc, "delalloc"},
	{FlagEncoded, "encoded"}, {FlagDataEncrypted, "encrypted"},
	{FlagNotAligned, "not_aligned"}, {FlagDataInline, "inline"},
	{FlagDataTail, "tail"}, {FlagUnwritten, "unwritten"},
	{FlagMerged, "merged"}, {FlagShared, "shared"},
}

// FlagString renders FIEMAP extent flags as a comma-separated list of names,
// like filefrag -v does; unknown bits are shown in hex.
func FlagString(flags uint32) string {
	var parts []string
	for _, f := range flagNames {
		if flags&f.bit != 0 {
			parts = append(parts, f.name)
			flags &^= f.bit
		}
	}
	if flags != 0 {
		parts = append(parts, fmt.Sprintf("0x%x", flags))
	}
	return strings.Join(parts, ",")
}

// Extent is one FIEMAP extent. All fields are in bytes; Physical is relative
// to the filesystem's device (Device.Path), not the whole disk.
type Extent struct {
	Logical  uint64 // offset in the file
	Physical uint64 // offset on the filesystem's device
	Length   uint64 // length of the extent; may run past the end of the file
	Flags    uint32 // raw FIEMAP_EXTENT_* bits
}
