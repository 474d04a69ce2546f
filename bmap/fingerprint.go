// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
)

// FingerprintLen is the length of a fingerprint: 32 lowercase hex digits.
const FingerprintLen = 32

// Fingerprint names the dataset a map describes, the same on every node holding a copy.
// It is 128 bits of a SHA-256 over the class names and each sample's path and size, in order.
// Equal fingerprints give every index the same file, label and length.
// Root, device, extents, inodes and times do not count; neither do same-size edits.
// A version 2 map also hashes its reader, listing, and each tensor's offset, type and shape.
func (m *Map) Fingerprint() string {
	h := fingerprinter{h: sha256.New(), buf: make([]byte, 0, fingerprintBuf)}
	h.bytes("nvfeed dataset fingerprint v1\x00")
	v2 := m.MinVersion() > 1
	if v2 {
		h.bytes("v2\x00")
		h.uint(uint64(m.Reader))
		h.uint(boolUint(m.Listed))
	}
	h.uint(uint64(len(m.Classes)))
	for _, c := range m.Classes {
		h.string(c)
	}
	h.uint(uint64(len(m.Samples)))
	for i := range m.Samples {
		s := &m.Samples[i]
		h.string(s.Path)
		h.uint(uint64(s.Label))
		h.uint(uint64(s.Size))
		if !v2 {
			continue
		}
		h.uint(uint64(s.Offset))
		if s.Tensor == nil {
			h.uint(0)
			continue
		}
		h.uint(uint64(s.Tensor.DType))
		h.uint(uint64(len(s.Tensor.Shape)))
		for _, d := range s.Tensor.Shape {
			h.uint(uint64(d))
		}
	}
	return hex.EncodeToString(h.sum()[:FingerprintLen/2])
}

func boolUint(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// fingerprintBuf is how many bytes fingerprinter gathers before it hashes
// them: one call into the hash per buffer, not per field (a 1.28 M-sample
// map is some 5 M fields).
const fingerprintBuf = 64 << 10

// fingerprinter feeds the fingerprint's byte stream to h through buf.
type fingerprinter struct {
	h   hash.Hash
	buf []byte
}

// bytes appends s as it is.
func (f *fingerprinter) bytes(s string) {
	for len(s) > 0 {
		if len(f.buf) == cap(f.buf) {
			f.flush()
		}
		n := copy(f.buf[len(f.buf):cap(f.buf)], s)
		f.buf = f.buf[:len(f.buf)+n]
		s = s[n:]
	}
}

// uint appends v as 8 little-endian bytes.
func (f *fingerprinter) uint(v uint64) {
	if cap(f.buf)-len(f.buf) < 8 {
		f.flush()
	}
	f.buf = binary.LittleEndian.AppendUint64(f.buf, v)
}

// string appends s with its length first, so that no two lists of
// strings hash alike.
func (f *fingerprinter) string(s string) {
	f.uint(uint64(len(s)))
	f.bytes(s)
}

func (f *fingerprinter) flush() {
	f.h.Write(f.buf)
	f.buf = f.buf[:0]
}

// sum returns the hash of everything appended.
func (f *fingerprinter) sum() []byte {
	f.flush()
	return f.h.Sum(nil)
}
