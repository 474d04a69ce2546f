// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math"

	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/extentinfo"
)

// The native .bmap layout. All integers are little-endian.
//
//	offset  size  field
//	0       8     magic "\x89BMAP\r\n\x1a" (catches text-mode mangling, like PNG's)
//	8       4     version (1 or 2)
//	12      4     flags (0)
//	16      8     payload length in bytes
//	24      4     CRC-32C of the payload
//	28      4     CRC-32C of bytes 0..28
//	32      …     payload
//
// The payload is a sequence of uvarints ("u"), zig-zag varints ("v") and
// strings (u length + bytes). Version 1:
//
//	root, device path, major u, minor u, disk, partition start u,
//	logical block size u, fs type, fs uuid,
//	class count u, classes…,
//	sample count u, extent count u, path-blob length u, path blob,
//	per sample: path length u, label u, size u, inode u, mtime v, ctime v,
//	            reason u, extent count u,
//	            per extent: logical u, physical u, length u, flags u.
//
// Version 2 (marked "+", the rest as in version 1):
//
//	root, device path, major u, minor u, disk, partition start u,
//	logical block size u, fs type, fs uuid,
//	+reader u (0 file, 1 numpy), +map flags u (bit 0: listed, bit 1:
//	discovery recorded),
//	+with bit 1: file filter, case-sensitive u (0 or 1), filter count u,
//	            filters… (the DiscoverOptions the samples were found with),
//	class count u, classes…,
//	sample count u, extent count u, +dimension count u (all samples'),
//	path-blob length u, path blob,
//	per sample: path length u, label v (listed labels may be negative),
//	            size u, inode u, mtime v, ctime v, reason u, extent count u,
//	            per extent: logical u, physical u, length u, flags u,
//	            +data offset u, +dtype u (0: none, else npy.DType),
//	            +with a dtype: rank u, dimensions u….
//
// A hand-made layout rather than msgpack: it decodes 1.28 M samples with
// three allocations (samples, extents, one string holding every path; a
// numpy map adds tensors and dimensions), bounds every count by the bytes
// left before allocating, and needs no reflection. Paths are kept
// together so that one string backs them all.
const (
	headerSize = 32
	magic      = "\x89BMAP\r\n\x1a"
	mapListed  = 1 << 0 // version 2 map flags: the samples are listed
	// versionWebDataset is bmap/wds's version 3: same magic and header
	// checksum at 28, records read in place (ErrWebDataset here).
	versionWebDataset = 3
	// mapDiscovery (version 2 map flags): Map.Discovery follows the
	// flags. A map without it is laid out as before it existed.
	mapDiscovery = 1 << 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// WriteBinary writes m in the native .bmap format, in its version's
// layout (version 1 for a map whose Version is 1, else version 2). A
// version 1 map holding what only version 2 can is refused.
func WriteBinary(w io.Writer, m *Map) error {
	v2 := m.Version != 1
	if !v2 && m.MinVersion() > 1 {
		return fmt.Errorf("bmap: write: a version 1 map cannot hold a %s map (listed=%v, tensors)", m.Reader, m.Listed)
	}
	var p []byte
	p = appendString(p, m.Root)
	d := &m.Device
	p = appendString(p, d.Path)
	p = binary.AppendUvarint(p, uint64(d.Major))
	p = binary.AppendUvarint(p, uint64(d.Minor))
	p = appendString(p, d.Disk)
	p = binary.AppendUvarint(p, d.PartitionStart)
	p = binary.AppendUvarint(p, uint64(d.LogicalBlockSize))
	p = appendString(p, d.FSType)
	p = appendString(p, d.FSUUID)
	if v2 {
		p = binary.AppendUvarint(p, uint64(m.Reader))
		var flags uint64
		if m.Listed {
			flags |= mapListed
		}
		if m.Discovery != nil {
			flags |= mapDiscovery
		}
		p = binary.AppendUvarint(p, flags)
		if o := m.Discovery; o != nil {
			p = appendString(p, o.FileFilter)
			cs := uint64(0)
			if o.CaseSensitive {
				cs = 1
			}
			p = binary.AppendUvarint(p, cs)
			p = binary.AppendUvarint(p, uint64(len(o.Filters)))
			for _, f := range o.Filters {
				p = appendString(p, f)
			}
		}
	}
	p = binary.AppendUvarint(p, uint64(len(m.Classes)))
	for _, c := range m.Classes {
		p = appendString(p, c)
	}
	nExt, nDim, pathLen := 0, 0, 0
	for i := range m.Samples {
		nExt += len(m.Samples[i].Extents)
		pathLen += len(m.Samples[i].Path)
		if t := m.Samples[i].Tensor; t != nil {
			nDim += len(t.Shape)
		}
	}
	p = binary.AppendUvarint(p, uint64(len(m.Samples)))
	p = binary.AppendUvarint(p, uint64(nExt))
	if v2 {
		p = binary.AppendUvarint(p, uint64(nDim))
	}
	p = binary.AppendUvarint(p, uint64(pathLen))
	for i := range m.Samples {
		p = append(p, m.Samples[i].Path...)
	}
	for i := range m.Samples {
		s := &m.Samples[i]
		p = binary.AppendUvarint(p, uint64(len(s.Path)))
		if v2 {
			p = binary.AppendVarint(p, int64(s.Label))
		} else {
			p = binary.AppendUvarint(p, uint64(uint32(s.Label)))
		}
		p = binary.AppendUvarint(p, uint64(s.Size))
		p = binary.AppendUvarint(p, s.Inode)
		p = binary.AppendVarint(p, s.MtimeNs)
		p = binary.AppendVarint(p, s.CtimeNs)
		p = binary.AppendUvarint(p, uint64(s.Reason))
		p = binary.AppendUvarint(p, uint64(len(s.Extents)))
		for _, e := range s.Extents {
			p = binary.AppendUvarint(p, e.Logical)
			p = binary.AppendUvarint(p, e.Physical)
			p = binary.AppendUvarint(p, e.Length)
			p = binary.AppendUvarint(p, uint64(e.Flags))
		}
		if v2 {
			p = binary.AppendUvarint(p, uint64(s.Offset))
			if s.Tensor == nil {
				p = binary.AppendUvarint(p, 0)
				continue
			}
			p = binary.AppendUvarint(p, uint64(s.Tensor.DType))
			p = binary.AppendUvarint(p, uint64(len(s.Tensor.Shape)))
			for _, d := range s.Tensor.Shape {
				p = binary.AppendUvarint(p, uint64(d))
			}
		}
	}
	version := uint32(1)
	if v2 {
		version = 2
	}
	var h [headerSize]byte
	copy(h[:], magic)
	binary.LittleEndian.PutUint32(h[8:], version)
	binary.LittleEndian.PutUint64(h[16:], uint64(len(p)))
	binary.LittleEndian.PutUint32(h[24:], crc32.Checksum(p, castagnoli))
	binary.LittleEndian.PutUint32(h[28:], crc32.Checksum(h[:28], castagnoli))
	if _, err := w.Write(h[:]); err != nil {
		return fmt.Errorf("bmap: write: %w", err)
	}
	if _, err := w.Write(p); err != nil {
		return fmt.Errorf("bmap: write: %w", err)
	}
	return nil
}

func appendString(p []byte, s string) []byte {
	p = binary.AppendUvarint(p, uint64(len(s)))
	return append(p, s...)
}

// IsBinary reports whether b starts with the .bmap magic.
func IsBinary(b []byte) bool { return bytes.HasPrefix(b, []byte(magic)) }

// DecodeBinary decodes a .bmap file held in b. Any truncation, corruption
// or inconsistency returns an error wrapping ErrCorrupt; it never panics.
func DecodeBinary(b []byte) (*Map, error) {
	if len(b) < headerSize || !IsBinary(b) {
		return nil, fmt.Errorf("%w: not a .bmap file (bad magic or shorter than %d bytes)", ErrCorrupt, headerSize)
	}
	if got, want := crc32.Checksum(b[:28], castagnoli), binary.LittleEndian.Uint32(b[28:]); got != want {
		return nil, fmt.Errorf("%w: header checksum mismatch", ErrCorrupt)
	}
	v := binary.LittleEndian.Uint32(b[8:])
	if v == versionWebDataset {
		return nil, ErrWebDataset
	}
	if v < 1 || v > Version {
		return nil, fmt.Errorf("%w: version %d, this build reads 1 to %d", ErrCorrupt, v, Version)
	}
	n := binary.LittleEndian.Uint64(b[16:])
	if n != uint64(len(b)-headerSize) {
		return nil, fmt.Errorf("%w: payload is %d bytes, header says %d (truncated?)", ErrCorrupt, len(b)-headerSize, n)
	}
	p := b[headerSize:]
	if crc32.Checksum(p, castagnoli) != binary.LittleEndian.Uint32(b[24:]) {
		return nil, fmt.Errorf("%w: payload checksum mismatch", ErrCorrupt)
	}
	m, err := decodePayload(p, int(v))
	if err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// decoder reads uvarints and strings, remembering the first error.
type decoder struct {
	p   []byte
	off int
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: payload offset %d: bad %s", ErrCorrupt, d.off, what)
	}
}

func (d *decoder) uvarint(what string) uint64 {
	if off := d.off; off < len(d.p) && d.p[off] < 0x80 && d.err == nil { // one byte: most counts, labels, flags (inlined)
		d.off = off + 1
		return uint64(d.p[off])
	}
	return d.uvarintLong(what)
}

// uvarintLong is uvarint past its one-byte case.
func (d *decoder) uvarintLong(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.p[d.off:])
	if n <= 0 {
		d.fail(what)
		return 0
	}
	d.off += n
	return v
}

func (d *decoder) varint(what string) int64 {
	if off := d.off; off < len(d.p) && d.p[off] < 0x80 && d.err == nil { // one byte (inlined): zig-zag, as binary.Varint
		d.off = off + 1
		return int64(d.p[off]>>1) ^ -int64(d.p[off]&1)
	}
	return d.varintLong(what)
}

// varintLong is varint past its one-byte case.
func (d *decoder) varintLong(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.p[d.off:])
	if n <= 0 {
		d.fail(what)
		return 0
	}
	d.off += n
	return v
}

// count reads a count of items each taking at least minBytes, refusing
// counts the remaining payload cannot hold (so corrupt input cannot make
// us allocate much).
func (d *decoder) count(what string, minBytes int) int {
	v := d.uvarint(what)
	if d.err == nil && v > uint64((len(d.p)-d.off)/minBytes) {
		d.fail(what)
		return 0
	}
	return int(v)
}

func (d *decoder) bytes(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.p)-d.off {
		d.fail(what)
		return nil
	}
	b := d.p[d.off : d.off+n]
	d.off += n
	return b
}

func (d *decoder) string(what string) string {
	return string(d.bytes(d.count(what, 1), what))
}

func (d *decoder) uint32(what string) uint32 {
	v := d.uvarint(what)
	if v > 1<<32-1 {
		d.fail(what)
	}
	return uint32(v)
}

func decodePayload(p []byte, version int) (*Map, error) {
	d := &decoder{p: p}
	m := &Map{Version: version}
	v2 := version >= 2
	m.Root = d.string("root")
	dev := &m.Device
	dev.Path = d.string("device path")
	dev.Major = d.uint32("device major")
	dev.Minor = d.uint32("device minor")
	dev.Disk = d.string("device disk")
	dev.PartitionStart = d.uvarint("partition start")
	dev.LogicalBlockSize = d.uint32("logical block size")
	dev.FSType = d.string("fs type")
	dev.FSUUID = d.string("fs uuid")
	if v2 {
		r := d.uvarint("reader")
		if r >= uint64(numReaders) {
			d.fail("reader")
		}
		m.Reader = Reader(r)
		flags := d.uvarint("map flags")
		if flags&^(mapListed|mapDiscovery) != 0 {
			d.fail("map flags")
		}
		m.Listed = flags&mapListed != 0
		if flags&mapDiscovery != 0 {
			o := &DiscoverOptions{FileFilter: d.string("file filter")}
			switch d.uvarint("case-sensitive") {
			case 0:
			case 1:
				o.CaseSensitive = true
			default:
				d.fail("case-sensitive")
			}
			if n := d.count("filter count", 1); d.err == nil && n > 0 {
				o.Filters = make([]string, n)
				for i := range o.Filters {
					o.Filters[i] = d.string("filter")
				}
			}
			m.Discovery = o
		}
	}
	nc := d.count("class count", 1)
	if d.err == nil && nc > 0 {
		m.Classes = make([]string, nc)
		for i := range m.Classes {
			m.Classes[i] = d.string("class name")
		}
	}
	ns := d.count("sample count", 8)
	ne := d.count("extent count", 4)
	nd := 0
	if v2 {
		nd = d.count("dimension count", 1)
	}
	blob := string(d.bytes(d.count("path blob length", 1), "path blob"))
	if d.err != nil {
		return nil, d.err
	}
	if ns > 0 {
		m.Samples = make([]Sample, ns)
	}
	exts := make([]extentinfo.Extent, ne)
	var dims []int64
	if nd > 0 {
		dims = make([]int64, nd)
	}
	var tensors []Tensor // allocated at the first tensor sample
	dimOff, nTensor := 0, 0
	pathOff, extOff := 0, 0
	for i := range m.Samples {
		s := &m.Samples[i]
		pl := d.uvarint("path length")
		if d.err == nil && pl > uint64(len(blob)-pathOff) {
			d.fail("path length")
		}
		if d.err != nil {
			return nil, fmt.Errorf("sample %d: %w", i, d.err)
		}
		s.Path = blob[pathOff : pathOff+int(pl)]
		pathOff += int(pl)
		if v2 {
			l := d.varint("label")
			if l < math.MinInt32 || l > math.MaxInt32 {
				d.fail("label")
			}
			s.Label = int32(l)
		} else {
			s.Label = int32(d.uint32("label"))
		}
		s.Size = int64(d.uvarint("size"))
		s.Inode = d.uvarint("inode")
		s.MtimeNs = d.varint("mtime")
		s.CtimeNs = d.varint("ctime")
		s.Reason = Reason(d.uvarint("reason"))
		k := d.count("sample extent count", 4)
		if d.err == nil && k > ne-extOff {
			d.fail("sample extent count")
		}
		if d.err != nil {
			return nil, fmt.Errorf("sample %d: %w", i, d.err)
		}
		s.Extents = exts[extOff : extOff+k : extOff+k]
		for j := range s.Extents {
			e := &s.Extents[j]
			e.Logical = d.uvarint("extent logical")
			e.Physical = d.uvarint("extent physical")
			e.Length = d.uvarint("extent length")
			e.Flags = d.uint32("extent flags")
		}
		extOff += k
		if k == 0 {
			s.Extents = nil
		}
		if !v2 {
			continue
		}
		off := d.uvarint("data offset")
		if off > math.MaxInt64 {
			d.fail("data offset")
		}
		s.Offset = int64(off)
		dt := d.uvarint("dtype")
		if dt == 0 || d.err != nil {
			continue
		}
		rank := d.count("rank", 1)
		if d.err == nil && (dt > math.MaxUint8 || rank > MaxRank || rank > nd-dimOff) {
			d.fail("tensor")
		}
		if d.err != nil {
			return nil, fmt.Errorf("sample %d: %w", i, d.err)
		}
		if tensors == nil {
			tensors = make([]Tensor, ns-i)
		}
		t := &tensors[nTensor]
		nTensor++
		t.DType = npy.DType(dt)
		if rank > 0 {
			t.Shape = dims[dimOff : dimOff+rank : dimOff+rank]
			for j := range t.Shape {
				v := d.uvarint("dimension")
				if v > math.MaxInt64 {
					d.fail("dimension")
				}
				t.Shape[j] = int64(v)
			}
			dimOff += rank
		}
		s.Tensor = t
	}
	switch {
	case d.err != nil:
		return nil, d.err
	case dimOff != nd:
		return nil, fmt.Errorf("%w: %d dimensions declared, %d used", ErrCorrupt, nd, dimOff)
	case pathOff != len(blob):
		return nil, fmt.Errorf("%w: path blob has %d unused bytes", ErrCorrupt, len(blob)-pathOff)
	case extOff != ne:
		return nil, fmt.Errorf("%w: %d extents declared, %d used", ErrCorrupt, ne, extOff)
	case d.off != len(p):
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(p)-d.off)
	}
	return m, nil
}
