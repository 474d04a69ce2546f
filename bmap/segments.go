// SPDX-License-Identifier: Apache-2.0

package bmap

import "github.com/nvfeed/nvfeed/extentinfo"

// Segment is one piece of a sample's bytes: either a range of the
// filesystem's device or a run of zeros (a hole or an unwritten extent).
type Segment struct {
	FileOff uint64 // offset in the file
	DevOff  uint64 // offset on the filesystem's device (Device.Path); unused when Zero
	Len     uint64 // length in bytes
	Zero    bool   // the range reads as zeros
}

// Segments appends to dst the pieces that make up bytes [0, s.Size) of a
// raw sample, in file order, covering every byte exactly once. Extents are
// clipped at the end of the file; adjacent extents contiguous on the device
// are merged.
func (s *Sample) Segments(dst []Segment) []Segment {
	size := uint64(s.Size)
	var pos uint64
	for _, e := range s.Extents {
		if e.Logical >= size {
			break
		}
		if e.Logical > pos {
			dst = appendSeg(dst, Segment{FileOff: pos, Len: e.Logical - pos, Zero: true})
			pos = e.Logical
		}
		end := min(e.Logical+e.Length, size)
		if end <= pos {
			continue
		}
		skip := pos - e.Logical
		seg := Segment{FileOff: pos, DevOff: e.Physical + skip, Len: end - pos, Zero: e.Flags&extentinfo.FlagUnwritten != 0}
		dst = appendSeg(dst, seg)
		pos = end
	}
	if pos < size {
		dst = appendSeg(dst, Segment{FileOff: pos, Len: size - pos, Zero: true})
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
