// SPDX-License-Identifier: Apache-2.0

// Package bmap builds, stores and checks block maps: for every sample of a
// dataset laid out for DALI's fn.readers.file (one subdirectory per class),
// the byte ranges of the filesystem's block device that hold it.
//
// A Map is made by Build, written and read in three formats (the native
// checksummed binary .bmap, JSON, and the xNVMe DALI example's JSON), and
// checked against the live filesystem by CheckDevice and CheckSample before
// anyone trusts its extents.
package bmap

import (
	"fmt"
	"path"
	"strings"

	"github.com/nvfeed/nvfeed/extentinfo"
)

// Version is the map format version this package writes.
const Version = 1

// Reason says why a sample must be read through the filesystem; Raw means
// every byte of it can be read from the device through its extents.
type Reason uint8

// Reasons, in the order their flags are checked.
const (
	Raw          Reason = iota // readable from the device
	Inline                     // data stored in the inode (FIEMAP_EXTENT_DATA_INLINE)
	TailPacked                 // data packed with other tails (FIEMAP_EXTENT_DATA_TAIL)
	Encoded                    // compressed or otherwise encoded
	Encrypted                  // encrypted on disk
	NotAligned                 // extent offsets not aligned to 512 bytes
	UnknownPlace               // location unknown or not yet allocated
	OtherFS                    // its real path lives on another filesystem
	Mismatch                   // an imported map disagrees with the filesystem
	NoExtents                  // its filesystem has no device extents (tmpfs, NFS, overlay, btrfs, …)
	numReasons
)

var reasonNames = [numReasons]string{
	Raw: "", Inline: "inline data", TailPacked: "tail-packed", Encoded: "encoded",
	Encrypted: "encrypted", NotAligned: "not aligned", UnknownPlace: "unknown location",
	OtherFS: "on another filesystem", Mismatch: "imported map disagrees with filesystem",
	NoExtents: "no device extents",
}

// String returns the reason as written in JSON ("" for Raw).
func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// ParseReason is the inverse of Reason.String.
func ParseReason(s string) (Reason, error) {
	for i, n := range reasonNames {
		if n == s {
			return Reason(i), nil
		}
	}
	return 0, fmt.Errorf("unknown reason %q", s)
}

// Sample is one dataset file.
type Sample struct {
	Path    string              // relative to the map's root, "class/file"
	Extents []extentinfo.Extent // physical extents, in file order
	Size    int64               // file size in bytes
	Inode   uint64              // inode number when mapped
	MtimeNs int64               // modification time when mapped (ns since epoch)
	CtimeNs int64               // change time when mapped (ns since epoch)
	Label   int32               // index of its class in Map.Classes
	Reason  Reason              // Raw, or why it must be read through the filesystem
}

// Map is a dataset's block map.
type Map struct {
	Version int               // format version
	Root    string            // absolute path of the dataset root when mapped
	Device  extentinfo.Device // the filesystem's block device
	Classes []string          // class directory names; label i is Classes[i]
	Samples []Sample          // in DALI order: by class, then by file name
}

// Validate checks the map's internal consistency: labels in range, paths
// relative, clean and inside their class, extents sorted, non-overlapping and
// 512-byte aligned for raw samples. Decoders call it; a map that passes
// cannot name bytes outside what its extents say.
func (m *Map) Validate() error {
	if m.Version != Version {
		return fmt.Errorf("%w: version %d, want %d", ErrCorrupt, m.Version, Version)
	}
	if !path.IsAbs(m.Root) {
		return fmt.Errorf("%w: root %q is not absolute", ErrCorrupt, m.Root)
	}
	for i, c := range m.Classes {
		if c == "" || c == "." || c == ".." || strings.ContainsAny(c, "/\x00") {
			return fmt.Errorf("%w: class %d: bad name %q", ErrCorrupt, i, c)
		}
	}
	for i := range m.Samples {
		if err := m.validateSample(&m.Samples[i]); err != nil {
			return fmt.Errorf("%w: sample %d (%q): %v", ErrCorrupt, i, m.Samples[i].Path, err)
		}
	}
	return nil
}

func (m *Map) validateSample(s *Sample) error {
	if s.Label < 0 || int(s.Label) >= len(m.Classes) {
		return fmt.Errorf("label %d out of range [0,%d)", s.Label, len(m.Classes))
	}
	cls, name, ok := strings.Cut(s.Path, "/")
	if !ok || cls != m.Classes[s.Label] || name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("path not of the form %s/<file>", m.Classes[s.Label])
	}
	if s.Size < 0 {
		return fmt.Errorf("negative size %d", s.Size)
	}
	if s.Reason >= numReasons {
		return fmt.Errorf("unknown reason %d", s.Reason)
	}
	var end uint64
	for j, e := range s.Extents {
		if e.Length == 0 || e.Logical+e.Length < e.Logical || e.Physical+e.Length < e.Physical {
			return fmt.Errorf("extent %d: bad length %d", j, e.Length)
		}
		if e.Logical < end {
			return fmt.Errorf("extent %d: logical %d overlaps the previous extent", j, e.Logical)
		}
		end = e.Logical + e.Length
		if s.Reason == Raw && e.Logical < uint64(s.Size) && (e.Physical%512 != 0 || e.Logical%512 != 0) {
			return fmt.Errorf("extent %d: raw extent not 512-byte aligned", j)
		}
	}
	return nil
}

// classify decides whether a file of the given size with these extents can
// be read raw from the device. Extents wholly past the end of the file are
// ignored; holes and unwritten extents read as zeros.
func classify(size int64, exts []extentinfo.Extent) Reason {
	for _, e := range exts {
		if e.Logical >= uint64(size) {
			continue
		}
		switch f := e.Flags; {
		case f&extentinfo.FlagDataInline != 0:
			return Inline
		case f&extentinfo.FlagDataTail != 0:
			return TailPacked
		case f&extentinfo.FlagEncoded != 0:
			return Encoded
		case f&extentinfo.FlagDataEncrypted != 0:
			return Encrypted
		case f&(extentinfo.FlagUnknown|extentinfo.FlagDelalloc) != 0:
			return UnknownPlace
		case f&extentinfo.FlagNotAligned != 0, e.Physical%512 != 0, e.Logical%512 != 0:
			return NotAligned
		}
	}
	return Raw
}

// Stats summarizes a map.
type Stats struct {
	Samples      int            // number of samples
	Bytes        int64          // sum of sample sizes
	Extents      int            // number of extents
	MultiExtent  int            // samples with more than one extent
	FSOnly       int            // samples that must be read through the filesystem
	FSOnlyReason map[Reason]int // FSOnly by reason
}

// Stats computes the map's summary.
func (m *Map) Stats() Stats {
	st := Stats{Samples: len(m.Samples), FSOnlyReason: map[Reason]int{}}
	for i := range m.Samples {
		s := &m.Samples[i]
		st.Bytes += s.Size
		st.Extents += len(s.Extents)
		if len(s.Extents) > 1 {
			st.MultiExtent++
		}
		if s.Reason != Raw {
			st.FSOnly++
			st.FSOnlyReason[s.Reason]++
		}
	}
	return st
}

// String renders the summary on one line.
func (st Stats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d samples, %d bytes, %d extents, %d multi-extent, %d filesystem-only",
		st.Samples, st.Bytes, st.Extents, st.MultiExtent, st.FSOnly)
	if st.FSOnly > 0 {
		b.WriteString(" (")
		sep := ""
		for r := Reason(1); r < numReasons; r++ {
			if n := st.FSOnlyReason[r]; n > 0 {
				fmt.Fprintf(&b, "%s%s: %d", sep, r, n)
				sep = ", "
			}
		}
		b.WriteString(")")
	}
	return b.String()
}
