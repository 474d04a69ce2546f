// SPDX-License-Identifier: Apache-2.0

// Package bmap builds, stores and checks block maps.
// A block map lists a dataset's samples in DALI's order, each with its device byte ranges.
// A dataset is what fn.readers.file or fn.readers.numpy reads.
// Maps are stored as binary .bmap, JSON, or xNVMe's DALI example JSON.
// Checker checks a map against the live filesystem before anyone trusts its extents.
package bmap

import (
	"fmt"
	"math"
	"path"
	"slices"
	"strings"

	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/extentinfo"
)

// Version is the newest map format version.
// Version 2 adds the reader kind, listed samples and tensors; version 1 is folders only.
// Build gives a map the lowest version that holds it; the decoders read both.
const Version = 2

// Reader is the DALI reader whose samples a map lists, and so what a
// sample's bytes are.
type Reader uint8

// Readers.
const (
	// ReaderFile is fn.readers.file: each sample is a whole file's bytes
	// (an encoded image, audio...) with an integer label.
	ReaderFile Reader = iota
	// ReaderNumpy is fn.readers.numpy. Each sample is the data of an .npy
	// file's array, without the header. Sample.Tensor holds its element
	// type and shape. There are no labels: every Label is 0.
	ReaderNumpy
	numReaders
)

// String returns the reader's name: "file" or "numpy".
func (r Reader) String() string {
	switch r {
	case ReaderFile:
		return "file"
	case ReaderNumpy:
		return "numpy"
	}
	return fmt.Sprintf("reader(%d)", uint8(r))
}

// ParseReader is the inverse of Reader.String.
func ParseReader(s string) (Reader, error) {
	for r := ReaderFile; r < numReaders; r++ {
		if r.String() == s {
			return r, nil
		}
	}
	return 0, fmt.Errorf("unknown reader %q (want file or numpy)", s)
}

// Reason says why a sample must be read through the filesystem. Raw means
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

// Sample is one dataset file's bytes [Offset, Offset+Size): a whole file, or an .npy file's data.
// The file is exactly Offset+Size bytes long.
type Sample struct {
	Path    string              // relative to the map's root: "class/file" in a folder layout
	Extents []extentinfo.Extent // the file's physical extents, in file order (Logical is the offset in the file)
	Size    int64               // bytes of the sample: the file's size, or a tensor's data size
	Offset  int64               // where the sample's bytes start in the file: 0, or a tensor's data offset (past the .npy header)
	Tensor  *Tensor             // element type and shape, for fn.readers.numpy; nil for fn.readers.file
	Inode   uint64              // inode number when mapped
	MtimeNs int64               // modification time when mapped (ns since epoch)
	CtimeNs int64               // change time when mapped (ns since epoch)
	Label   int32               // the class index in a folder layout; the listed label; 0 for tensors
	Reason  Reason              // Raw, or why it must be read through the filesystem
}

// Tensor says what a tensor sample's bytes hold: a C-order (row-major)
// array of Shape, elements of DType, little-endian. Its size in bytes is
// the sample's Size.
type Tensor struct {
	DType npy.DType // element type
	Shape []int64   // dimensions, outermost first; nil for a 0-d array (one element)
}

// NBytes returns the size of the array's data: the product of the shape
// times the element size. Validate guarantees that it fits an int64.
func (t *Tensor) NBytes() int64 {
	n := int64(t.DType.ItemSize())
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// FileSize returns the size the sample's file had when mapped.
func (s *Sample) FileSize() int64 { return s.Offset + s.Size }

// Map is a dataset's block map.
type Map struct {
	Version int               // format version (see Version)
	Root    string            // absolute path of the dataset root when mapped
	Device  extentinfo.Device // the filesystem's block device
	Reader  Reader            // the DALI reader whose samples these are
	// Listed says the samples come from a list, not from walking Root. The
	// list is DALI's file_list, or files and labels. The samples keep its
	// order and labels. Classes is then empty.
	Listed  bool
	Classes []string // class directory names of a folder layout; label i is Classes[i]
	Samples []Sample // in DALI order (see Build)
	// Discovery holds mkbmap's filters where they were not DALI's defaults; else nil.
	// Unmapped counts new files by it. It is not part of the fingerprint.
	Discovery *DiscoverOptions
}

// Discovered returns the options the map's samples were found with:
// Discovery, or the zero DiscoverOptions (DALI's defaults).
func (m *Map) Discovered() DiscoverOptions {
	if m.Discovery == nil {
		return DiscoverOptions{}
	}
	return *m.Discovery
}

// MinVersion returns the lowest format version that holds m: 1 for
// fn.readers.file's folder layout found with DALI's default filters, 2
// for anything else.
func (m *Map) MinVersion() int {
	if m.Reader != ReaderFile || m.Listed || m.Discovery != nil {
		return 2
	}
	for i := range m.Samples {
		if s := &m.Samples[i]; s.Offset != 0 || s.Tensor != nil {
			return 2
		}
	}
	return 1
}

// Dirs returns the directories holding the samples, sorted, relative to Root.
// For each sample it returns its directory's index; in a folder layout that is the label.
func (m *Map) Dirs() (dirs []string, dirOf []int32) {
	dirOf = make([]int32, len(m.Samples))
	if m.Reader == ReaderFile && !m.Listed {
		for i := range m.Samples {
			dirOf[i] = m.Samples[i].Label
		}
		return m.Classes, dirOf
	}
	index := map[string]int32{}
	for i := range m.Samples {
		index[path.Dir(m.Samples[i].Path)] = 0
	}
	dirs = make([]string, 0, len(index))
	for d := range index {
		dirs = append(dirs, d)
	}
	slices.Sort(dirs)
	for i, d := range dirs {
		index[d] = int32(i)
	}
	for i := range m.Samples {
		dirOf[i] = index[path.Dir(m.Samples[i].Path)]
	}
	return dirs, dirOf
}

// Limits Validate puts on a map, so that a hostile one cannot make its
// reader allocate much from a few bytes.
const (
	// MaxRank is the most dimensions a tensor sample may have.
	MaxRank = npy.MaxRank
	// MaxDataOffset is the largest data offset of a tensor sample: past
	// the longest .npy format 1.0 header.
	MaxDataOffset = npy.MaxDataOffset
)

// Validate checks the map's internal consistency:
//
//   - a known version that holds what the map uses;
//   - labels in range for the folder layout (Classes), and 0 for tensors;
//   - paths relative and clean, inside their class in a folder layout,
//     never leading out of the root;
//   - tensors on numpy maps only, and on every sample there. Each has a
//     known type and at most MaxRank non-negative dimensions. Its data
//     size is the sample's Size. Its offset lies past an .npy header, at
//     most MaxDataOffset, and Offset+Size fits an int64;
//   - for raw samples, extents sorted, non-overlapping and 512-byte
//     aligned.
//
// Decoders call it. A map that passes cannot name bytes outside what its
// extents say.
func (m *Map) Validate() error {
	if m.Version < 1 || m.Version > Version {
		return fmt.Errorf("%w: version %d, this build reads 1 to %d", ErrCorrupt, m.Version, Version)
	}
	if m.Reader >= numReaders {
		return fmt.Errorf("%w: unknown reader %d", ErrCorrupt, m.Reader)
	}
	if v := m.MinVersion(); m.Version < v {
		return fmt.Errorf("%w: version %d cannot hold a %s map (listed=%v, tensors): version %d needed", ErrCorrupt, m.Version, m.Reader, m.Listed, v)
	}
	if !path.IsAbs(m.Root) {
		return fmt.Errorf("%w: root %q is not absolute", ErrCorrupt, m.Root)
	}
	if (m.Listed || m.Reader != ReaderFile) && len(m.Classes) > 0 {
		return fmt.Errorf("%w: %d classes in a %s map: classes belong to fn.readers.file's folder layout", ErrCorrupt, len(m.Classes), m.kind())
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

// kind names the map's sort in messages.
func (m *Map) kind() string {
	if m.Listed {
		return "listed " + m.Reader.String()
	}
	return m.Reader.String()
}

func (m *Map) validateSample(s *Sample) error {
	if m.Reader == ReaderFile && !m.Listed {
		if s.Label < 0 || int(s.Label) >= len(m.Classes) {
			return fmt.Errorf("label %d out of range [0,%d)", s.Label, len(m.Classes))
		}
		cls, name, ok := strings.Cut(s.Path, "/")
		if !ok || cls != m.Classes[s.Label] || name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
			return fmt.Errorf("path not of the form %s/<file>", m.Classes[s.Label])
		}
	} else if err := checkListedPath(s.Path); err != nil {
		return err
	}
	if m.Reader == ReaderNumpy && s.Label != 0 {
		return fmt.Errorf("label %d in a numpy map (tensors have none: 0)", s.Label)
	}
	if s.Size < 0 {
		return fmt.Errorf("negative size %d", s.Size)
	}
	if err := m.validateTensor(s); err != nil {
		return err
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
		if s.Reason == Raw && e.Logical < uint64(s.FileSize()) && (e.Physical%512 != 0 || e.Logical%512 != 0) {
			return fmt.Errorf("extent %d: raw extent not 512-byte aligned", j)
		}
	}
	return nil
}

// validateTensor checks a sample's offset and tensor against its map's
// reader.
func (m *Map) validateTensor(s *Sample) error {
	t := s.Tensor
	if m.Reader != ReaderNumpy {
		if t != nil || s.Offset != 0 {
			return fmt.Errorf("tensor or data offset %d in a %s map", s.Offset, m.Reader)
		}
		return nil
	}
	if t == nil {
		return fmt.Errorf("no element type and shape in a numpy map")
	}
	if s.Offset <= 10 || s.Offset > MaxDataOffset {
		return fmt.Errorf("data offset %d outside an .npy header's (10, %d]", s.Offset, MaxDataOffset)
	}
	if s.Size > math.MaxInt64-s.Offset {
		return fmt.Errorf("data offset %d + size %d overflow", s.Offset, s.Size)
	}
	if !t.DType.Valid() {
		return fmt.Errorf("unknown element type %d", t.DType)
	}
	if len(t.Shape) > MaxRank {
		return fmt.Errorf("%d dimensions, at most %d", len(t.Shape), MaxRank)
	}
	if t.Shape != nil && len(t.Shape) == 0 {
		return fmt.Errorf("empty non-nil shape (a 0-d array's shape is nil)")
	}
	n := int64(t.DType.ItemSize())
	for _, d := range t.Shape {
		if d < 0 {
			return fmt.Errorf("negative dimension in shape %s", npy.FormatShape(t.Shape))
		}
		if d > 1 && n > math.MaxInt64/d {
			return fmt.Errorf("shape %s of %s overflows", npy.FormatShape(t.Shape), t.DType)
		}
		if d > 0 {
			n *= d
		}
	}
	if nb := t.NBytes(); nb != s.Size {
		return fmt.Errorf("%s data of shape %s is %d bytes, size says %d", t.DType, npy.FormatShape(t.Shape), nb, s.Size)
	}
	return nil
}

// checkListedPath checks a listed or discovered path: relative, clean, not
// the root, not leading out of it.
func checkListedPath(p string) error {
	if p == "" || p == "." || path.IsAbs(p) || path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../") || strings.ContainsRune(p, 0) {
		return fmt.Errorf("path is not a clean relative path inside the root")
	}
	return nil
}

// classify decides whether the bytes [off, off+size) of a file with these
// extents can be read raw from the device. Extents wholly outside the
// range are ignored; holes and unwritten extents read as zeros.
func classify(off, size int64, exts []extentinfo.Extent) Reason {
	lo, hi := uint64(off), uint64(off+size)
	for _, e := range exts {
		if e.Logical >= hi || e.Logical+e.Length <= lo {
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
