// SPDX-License-Identifier: Apache-2.0

package bmap

import "github.com/nvfeed/nvfeed/extentinfo"

// Segment is one piece of a sample's bytes: either a range of the
// filesystem's device or a run of zeros (a hole or an unwritten extent).
type Segment struct {
	FileOff uint64 // offset in the sample's bytes: the offset in the file less Sample.Offset
	DevOff  uint64 // offset on the filesystem's device (Device.Path); unused when Zero
	Len     uint64 // length in bytes
	Zero    bool   // the range reads as zeros
}

// Segments appends to dst the pieces that make up a raw sample's bytes,
// the file's bytes [s.Offset, s.Offset+s.Size), in order, covering every
// byte exactly once; FileOff counts from the sample's first byte, so a
// tensor's header is not among them. Extents are clipped to the range;
// adjacent extents contiguous on the device are merged.
func (s *Sample) Segments(dst []Segment) []Segment {
	base := uint64(s.Offset)
	end := base + uint64(s.Size)
	pos := base
	for _, e := range s.Extents {
		if e.Logical >= end {
			break
		}
		eEnd := min(e.Logical+e.Length, end)
		if eEnd <= pos {
			continue
		}
		if e.Logical > pos {
			dst = appendSeg(dst, Segment{FileOff: pos - base, Len: e.Logical - pos, Zero: true})
			pos = e.Logical
		}
		skip := pos - e.Logical
		seg := Segment{FileOff: pos - base, DevOff: e.Physical + skip, Len: eEnd - pos, Zero: e.Flags&extentinfo.FlagUnwritten != 0}
		dst = appendSeg(dst, seg)
		pos = eEnd
	}
	if pos < end {
		dst = appendSeg(dst, Segment{FileOff: pos - base, Len: end - pos, Zero: true})
	}
	return dst
}

func appendSeg(dst []Segment, s Segment) []Segment {
	if n := len(dst); n > 0 {
		p := &dst[n-1]
		if p.Zero && s.Zero || !p.Zero && !s.Zero && p.DevOff+p.Len == s.DevOff {
			p.Len += s.Len
			return dst
		}
	}
	return append(dst, s)
}
