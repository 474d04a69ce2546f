// SPDX-License-Identifier: Apache-2.0

package wds

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
)

// Version is the .bmap format version of a webdataset map.
const Version = 3

// The version 3 layout: fixed-size records, read in place from the
// process's own read-only copy of the file (Open), so that a sample's
// lookup decodes nothing but its records. All integers are
// little-endian.
//
//	offset  size  field
//	0       8     magic "\x89BMAP\r\n\x1a" (as versions 1 and 2)
//	8       4     version (3)
//	12      4     flags (0)
//	16      8     file length in bytes
//	24      4     CRC-32C of bytes 96..end (checked by Check, as Open does)
//	28      4     CRC-32C of bytes 0..28 (where versions 1 and 2 have theirs)
//	32      8     shards: length of the embedded version 2 map
//	40      8     extension table length
//	48      8     extension count E
//	56      8     sample count S
//	64      8     component count C
//	72      8     key bytes K
//	80      12    zero
//	92      4     CRC-32C of bytes 32..92
//	96      …     extension table: E × (u16 length + bytes)
//	        …     shards: a listed fn.readers.file map (bmap's version 2),
//	              one sample per tar, in shard order, with its extents
//	        24·S  samples: first component u64, key offset u64, shard u32,
//	              component count u32 (a key ends where the next begins)
//	        24·C  components: data offset in the tar u64, size u64,
//	              extension index u32, flags u32 (bit 0: the member's
//	              name has no dot: it is its own key and extension)
//	        K     keys, back to back
const (
	headerSize = 96
	magic      = "\x89BMAP\r\n\x1a"
	sampleRec  = 24
	compRec    = 24
	flagNoDot  = 1
	maxExts    = 1 << 16
)

// ErrCorrupt is wrapped by the errors of a map that fails its checks.
var ErrCorrupt = bmap.ErrCorrupt

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Map is a webdataset map. Its records stay in a read-only copy and are read without allocating.
// A Map is safe for concurrent use. Close frees Open's copy.
type Map struct {
	// Shards are the tars, in shard order. They form a listed
	// fn.readers.file map whose sample i is shard i, with its path,
	// extents, inode, times, size and Reason. bmap/fresh guards them.
	Shards *bmap.Map

	data    []byte // the whole file
	owned   bool   // data is Open's own anonymous mapping: Close unmaps it
	exts    []string
	samples []byte
	comps   []byte
	keys    []byte
	nSample int
	nComp   int

	ixOnce sync.Once
	ix     *index // the samples by pattern (index.go): one pass over the records, at Check
	ixErr  error
}

// Sample is one sample's record: its shard, key and components
// [First, First+Count).
type Sample struct {
	Shard        int
	Key          string // backed by the mapping: valid until Close
	First, Count int
}

// Component is one member of a sample: its data's byte range in its
// shard's tar and its extension (an index into Exts).
type Component struct {
	Offset, Size int64
	Ext          int
	NoDot        bool // the member's name has no dot: its name is the key
}

// Name returns the member's name in the tar, from its sample's key.
func (c Component) Name(m *Map, key string) string {
	if c.NoDot {
		return key // == its extension
	}
	return key + "." + m.exts[c.Ext]
}

// Len returns the number of samples.
func (m *Map) Len() int { return m.nSample }

// Components returns the number of components.
func (m *Map) Components() int { return m.nComp }

// Exts returns the distinct extensions of the map's components.
func (m *Map) Exts() []string { return m.exts }

// Bytes returns the size of the map file.
func (m *Map) Bytes() int64 { return int64(len(m.data)) }

// Sample returns sample i's record, checked against the map: a corrupt
// record is an error wrapping ErrCorrupt, never a read out of bounds.
func (m *Map) Sample(i int) (Sample, error) {
	if i < 0 || i >= m.nSample {
		return Sample{}, fmt.Errorf("wds: sample %d out of range [0,%d)", i, m.nSample)
	}
	r := m.samples[i*sampleRec:]
	first, koff := binary.LittleEndian.Uint64(r), binary.LittleEndian.Uint64(r[8:])
	shard, count := binary.LittleEndian.Uint32(r[16:]), binary.LittleEndian.Uint32(r[20:])
	kend := uint64(len(m.keys))
	if i+1 < m.nSample {
		kend = binary.LittleEndian.Uint64(m.samples[(i+1)*sampleRec+8:])
	}
	switch {
	case int(shard) >= len(m.Shards.Samples):
		return Sample{}, fmt.Errorf("%w: sample %d: shard %d of %d", ErrCorrupt, i, shard, len(m.Shards.Samples))
	case first > uint64(m.nComp) || uint64(count) > uint64(m.nComp)-first:
		return Sample{}, fmt.Errorf("%w: sample %d: components [%d,+%d) of %d", ErrCorrupt, i, first, count, m.nComp)
	case koff > kend || kend > uint64(len(m.keys)):
		return Sample{}, fmt.Errorf("%w: sample %d: key [%d,%d) of %d bytes", ErrCorrupt, i, koff, kend, len(m.keys))
	}
	k := m.keys[koff:kend]
	return Sample{Shard: int(shard), Key: unsafe.String(unsafe.SliceData(k), len(k)), First: int(first), Count: int(count)}, nil
}

// Component returns component j of sample s (j in [s.First,
// s.First+s.Count)), checked: its range lies inside its shard's tar, on
// a block boundary.
func (m *Map) Component(s Sample, j int) (Component, error) {
	if j < s.First || j >= s.First+s.Count {
		return Component{}, fmt.Errorf("wds: component %d not of the sample (%d,+%d)", j, s.First, s.Count)
	}
	r := m.comps[j*compRec:]
	off, size := binary.LittleEndian.Uint64(r), binary.LittleEndian.Uint64(r[8:])
	ext, flags := binary.LittleEndian.Uint32(r[16:]), binary.LittleEndian.Uint32(r[20:])
	tar := uint64(m.Shards.Samples[s.Shard].Size)
	switch {
	case int(ext) >= len(m.exts):
		return Component{}, fmt.Errorf("%w: component %d: extension %d of %d", ErrCorrupt, j, ext, len(m.exts))
	case off%BlockSize != 0 || off > tar || size > tar-off:
		return Component{}, fmt.Errorf("%w: component %d: bytes [%d,+%d) not inside its %d-byte tar on a block", ErrCorrupt, j, off, size, tar)
	case flags&^flagNoDot != 0:
		return Component{}, fmt.Errorf("%w: component %d: flags %#x", ErrCorrupt, j, flags)
	}
	return Component{Offset: int64(off), Size: int64(size), Ext: int(ext), NoDot: flags&flagNoDot != 0}, nil
}

// Open reads the map file at path into the process's own memory and checks all of it.
// Nothing its writer does to the file then reaches the map.
func Open(path string) (*Map, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("wds: %w", err)
	}
	defer f.Close()
	m, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("wds: %s: %w", path, err)
	}
	return m, nil
}

// Read reads a version 3 map from f into read-only anonymous memory and checks it.
// A file that changes size while read is refused.
func Read(f *os.File) (*Map, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() < headerSize {
		return nil, fmt.Errorf("%w: %d bytes, shorter than a header", ErrCorrupt, st.Size())
	}
	b, err := readOwned(f, st.Size())
	if err != nil {
		return nil, err
	}
	m, err := Decode(b)
	if err == nil {
		m.owned = true
		if err = m.Check(); err != nil {
			m.Close()
		}
	} else {
		_ = unix.Munmap(b)
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

// readOwned copies f's size bytes into a new anonymous mapping, then makes it read-only.
// read(2) answers a cut file with a short count, never a fault.
func readOwned(f *os.File, size int64) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("memory for the map's %d bytes: %w", size, err)
	}
	n, err := f.ReadAt(b, 0)
	if err == nil {
		var one [1]byte
		if k, _ := f.ReadAt(one[:], size); k != 0 {
			err = fmt.Errorf("%w: the file grew while it was read", ErrCorrupt)
		}
	} else if errors.Is(err, io.EOF) {
		err = fmt.Errorf("%w: the file shrank to %d of %d bytes while it was read", ErrCorrupt, n, size)
	}
	if err == nil {
		err = unix.Mprotect(b, unix.PROT_READ)
	}
	if err != nil {
		_ = unix.Munmap(b)
		return nil, err
	}
	return b, nil
}

// Close unmaps a map Open read; its keys are no longer valid.
func (m *Map) Close() error {
	if !m.owned || m.data == nil {
		return nil
	}
	err := unix.Munmap(m.data)
	m.data, m.samples, m.comps, m.keys = nil, nil, nil, nil
	m.nSample, m.nComp = 0, 0
	return err
}

// IsVersion3 reports whether b starts a version 3 map's header.
func IsVersion3(b []byte) bool {
	return len(b) >= 12 && string(b[:8]) == magic && binary.LittleEndian.Uint32(b[8:]) == Version
}

// Decode reads a version 3 map held in b and checks its header and shards.
// b is not copied: it must outlive the map and stay unchanged. The records
// are checked on access (Sample, Component), or all at once by Check.
func Decode(b []byte) (*Map, error) {
	if len(b) < headerSize || string(b[:8]) != magic {
		return nil, fmt.Errorf("%w: not a .bmap file", ErrCorrupt)
	}
	le := binary.LittleEndian
	if crc32.Checksum(b[:28], castagnoli) != le.Uint32(b[28:]) || crc32.Checksum(b[32:92], castagnoli) != le.Uint32(b[92:]) {
		return nil, fmt.Errorf("%w: header checksum mismatch", ErrCorrupt)
	}
	if v := le.Uint32(b[8:]); v != Version {
		return nil, fmt.Errorf("%w: version %d: a webdataset map is version %d (bmap.Load reads 1 and 2)", ErrCorrupt, v, Version)
	}
	if f := le.Uint32(b[12:]); f != 0 {
		return nil, fmt.Errorf("%w: flags %#x", ErrCorrupt, f)
	}
	if n := le.Uint64(b[16:]); n != uint64(len(b)) {
		return nil, fmt.Errorf("%w: %d bytes, header says %d (truncated?)", ErrCorrupt, len(b), n)
	}
	filesLen, extLen, nExt := le.Uint64(b[32:]), le.Uint64(b[40:]), le.Uint64(b[48:])
	nSample, nComp, keyLen := le.Uint64(b[56:]), le.Uint64(b[64:]), le.Uint64(b[72:])
	rest := uint64(len(b) - headerSize)
	const big = 1 << 56
	if filesLen > big || extLen > big || nSample > big/sampleRec || nComp > big/compRec || keyLen > big ||
		extLen+filesLen+nSample*sampleRec+nComp*compRec+keyLen != rest || nExt > maxExts {
		return nil, fmt.Errorf("%w: section sizes do not add up to the file's %d bytes", ErrCorrupt, len(b))
	}
	m := &Map{data: b, nSample: int(nSample), nComp: int(nComp)}
	p := b[headerSize:]
	et, p := p[:extLen], p[extLen:]
	m.exts = make([]string, 0, nExt)
	for range nExt {
		if len(et) < 2 || int(le.Uint16(et)) > len(et)-2 {
			return nil, fmt.Errorf("%w: extension table cut short", ErrCorrupt)
		}
		n := int(le.Uint16(et))
		m.exts = append(m.exts, string(et[2:2+n]))
		et = et[2+n:]
	}
	if len(et) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the extension table", ErrCorrupt, len(et))
	}
	shards, err := bmap.DecodeBinary(p[:filesLen])
	if err != nil {
		return nil, fmt.Errorf("shards: %w", err)
	}
	if shards.Reader != bmap.ReaderFile || !shards.Listed || len(shards.Samples) == 0 || len(shards.Samples) > 1<<31 {
		return nil, fmt.Errorf("%w: shards: want a listed file map of 1 to 2^31 tars, have %d (%s)", ErrCorrupt, len(shards.Samples), shards.Reader)
	}
	m.Shards = shards
	p = p[filesLen:]
	m.samples, p = p[:nSample*sampleRec], p[nSample*sampleRec:]
	m.comps, m.keys = p[:nComp*compRec], p[nComp*compRec:]
	return m, nil
}

// Check reads every record and the body's checksum. It indexes the samples
// for Select (index.go). Open does this before it returns. It costs one
// read of the whole file.
func (m *Map) Check() error {
	if crc32.Checksum(m.data[headerSize:], castagnoli) != binary.LittleEndian.Uint32(m.data[24:]) {
		return fmt.Errorf("%w: body checksum mismatch", ErrCorrupt)
	}
	_, err := m.indexed()
	return err
}

// indexed returns the map's index, made by the first call (one pass
// over the records, each checked).
func (m *Map) indexed() (*index, error) {
	m.ixOnce.Do(func() { m.ix, m.ixErr = m.buildIndex() })
	return m.ix, m.ixErr
}

// IndexBytes is the memory the index holds beside the map: 4 bytes a
// sample, and the largest rooms of each pattern's components.
func (m *Map) IndexBytes() int64 {
	ix, err := m.indexed()
	if err != nil {
		return 0
	}
	return ix.bytes()
}

// Writer writes a version 3 map, shard after shard. Its memory is bounded
// by its shards. Records go to temporary files beside the map until Close
// assembles it.
type Writer struct {
	path                 string
	tmp                  [3]*os.File // samples, components, keys
	buf                  [3]*bufio.Writer
	extIndex             map[string]uint32
	exts                 []string
	nSample, nComp, keys uint64
	shard                uint32
	rec                  [24]byte
}

// NewWriter starts a map to be written at path.
func NewWriter(path string) (*Writer, error) {
	w := &Writer{path: path, extIndex: map[string]uint32{}}
	for i := range w.tmp {
		f, err := os.CreateTemp(filepath.Dir(path), ".wdsmap-*")
		if err != nil {
			w.Abort()
			return nil, fmt.Errorf("wds: %w", err)
		}
		_ = os.Remove(f.Name()) // unlinked: gone with the descriptor
		w.tmp[i], w.buf[i] = f, bufio.NewWriterSize(f, 1<<20)
	}
	return w, nil
}

// Shard starts the next shard: the samples added after it are its own.
func (w *Writer) Shard(i int) { w.shard = uint32(i) }

// Sample adds a sample of the current shard: its key and its components'
// names (split by SplitName), data offsets and sizes.
func (w *Writer) Sample(key string, names []string, offsets, sizes []int64) error {
	le := binary.LittleEndian
	le.PutUint64(w.rec[0:], w.nComp)
	le.PutUint64(w.rec[8:], w.keys)
	le.PutUint32(w.rec[16:], w.shard)
	le.PutUint32(w.rec[20:], uint32(len(names)))
	w.buf[0].Write(w.rec[:])
	w.buf[2].WriteString(key)
	w.nSample++
	w.keys += uint64(len(key))
	for k, name := range names {
		_, ext, dot := splitDot(name)
		var flags uint32
		if !dot {
			flags = flagNoDot // its extension is its whole name, as DALI's
		}
		x, ok := w.extIndex[ext]
		if !ok {
			if len(w.exts) >= maxExts || len(ext) > 0xffff {
				return fmt.Errorf("wds: extension %q: more than %d distinct extensions, or too long", ext, maxExts)
			}
			x = uint32(len(w.exts))
			w.extIndex[ext] = x
			w.exts = append(w.exts, ext)
		}
		le.PutUint64(w.rec[0:], uint64(offsets[k]))
		le.PutUint64(w.rec[8:], uint64(sizes[k]))
		le.PutUint32(w.rec[16:], x)
		le.PutUint32(w.rec[20:], flags)
		w.buf[1].Write(w.rec[:])
		w.nComp++
	}
	return nil
}

// Close writes the map: header, extensions, shards and the records.
func (w *Writer) Close(shards *bmap.Map) (err error) {
	defer w.Abort()
	for _, b := range w.buf {
		if err := b.Flush(); err != nil {
			return fmt.Errorf("wds: write %s: %w", w.path, err)
		}
	}
	var et []byte
	for _, e := range w.exts {
		et = binary.LittleEndian.AppendUint16(et, uint16(len(e)))
		et = append(et, e...)
	}
	shards.Version = 2
	var sb bytesBuffer
	if err := bmap.WriteBinary(&sb, shards); err != nil {
		return fmt.Errorf("wds: %w", err)
	}
	f, err := os.Create(w.path)
	if err != nil {
		return fmt.Errorf("wds: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("wds: %w", cerr)
		}
	}()
	crc := crc32.New(castagnoli)
	out := io.MultiWriter(f, crc)
	if _, err := f.Write(make([]byte, headerSize)); err != nil {
		return fmt.Errorf("wds: write %s: %w", w.path, err)
	}
	if _, err := out.Write(et); err != nil {
		return fmt.Errorf("wds: write %s: %w", w.path, err)
	}
	if _, err := out.Write(sb); err != nil {
		return fmt.Errorf("wds: write %s: %w", w.path, err)
	}
	for _, t := range w.tmp {
		if _, err := t.Seek(0, io.SeekStart); err != nil {
			return fmt.Errorf("wds: %w", err)
		}
		if _, err := io.Copy(out, bufio.NewReaderSize(t, 1<<20)); err != nil {
			return fmt.Errorf("wds: write %s: %w", w.path, err)
		}
	}
	var h [headerSize]byte
	le := binary.LittleEndian
	copy(h[:], magic)
	le.PutUint32(h[8:], Version)
	total := uint64(headerSize+len(et)+len(sb)) + w.nSample*sampleRec + w.nComp*compRec + w.keys
	le.PutUint64(h[16:], total)
	le.PutUint32(h[24:], crc.Sum32())
	le.PutUint32(h[28:], crc32.Checksum(h[:28], castagnoli))
	le.PutUint64(h[32:], uint64(len(sb)))
	le.PutUint64(h[40:], uint64(len(et)))
	le.PutUint64(h[48:], uint64(len(w.exts)))
	le.PutUint64(h[56:], w.nSample)
	le.PutUint64(h[64:], w.nComp)
	le.PutUint64(h[72:], w.keys)
	le.PutUint32(h[92:], crc32.Checksum(h[32:92], castagnoli))
	if _, err := f.WriteAt(h[:], 0); err != nil {
		return fmt.Errorf("wds: write %s: %w", w.path, err)
	}
	return nil
}

// Abort drops what the writer holds (after Close, a no-op).
func (w *Writer) Abort() {
	for i, t := range w.tmp {
		if t != nil {
			_ = t.Close()
			w.tmp[i] = nil
		}
	}
}

// bytesBuffer is an io.Writer appending to a byte slice.
type bytesBuffer []byte

func (b *bytesBuffer) Write(p []byte) (int, error) { *b = append(*b, p...); return len(p), nil }

// Content summarises the map's samples as a reader names them.
// A sample's name is its tar's path, its key and its members' extensions:
// "shard-0.tar/x001.{cls,jpg}". Its size is its members' bytes.
// It has no label.
func (m *Map) Content() (bmap.Content, error) {
	d := bmap.NewContentDigester(m.nSample)
	for i := range m.nSample {
		s, err := m.Sample(i)
		if err != nil {
			return bmap.Content{}, err
		}
		var size int64
		exts := make([]string, 0, s.Count)
		for j := s.First; j < s.First+s.Count; j++ {
			c, err := m.Component(s, j)
			if err != nil {
				return bmap.Content{}, err
			}
			size += c.Size
			exts = append(exts, c.Name(m, s.Key)[len(s.Key):])
		}
		d.Add(m.Shards.Samples[s.Shard].Path+"/"+s.Key+memberExts(exts), size, -1)
	}
	return d.Content(), nil
}

// memberExts writes a sample's member suffixes: ".jpg" or ".{cls,jpg}".
func memberExts(exts []string) string {
	if len(exts) == 1 {
		return exts[0]
	}
	for i, e := range exts {
		exts[i] = strings.TrimPrefix(e, ".")
	}
	return ".{" + strings.Join(exts, ",") + "}"
}
