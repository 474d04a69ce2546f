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

// Fingerprint names the dataset a map describes, the same on every node
// that holds a copy of it: the first 128 bits of a SHA-256, in hex, over
// the class names and, in DALI's order, every sample's path (relative to
// the root, so its class and label) and size. Two maps with one
// fingerprint give every sample index the same file, label and length, so
// ranks that sample them alike read the same data; where the root, the
// device, the extents or a sample's inode and times differ (another node,
// another copy), the fingerprint does not. A file changed in place to the
// same size keeps it: fingerprints compare datasets, not their bytes.
// A map that only format version 2 holds (numpy, listed) also hashes its
// reader, whether it is listed and each sample's data offset, element
// type and shape; a folder-layout map's fingerprint is what it was before
// version 2.
func (m *Map) Fingerprint() string {
	h := sha256.New()
	h.Write([]byte("nvfeed dataset fingerprint v1\x00"))
	v2 := m.MinVersion() > 1
	if v2 {
		h.Write([]byte("v2\x00"))
		writeUint(h, uint64(m.Reader))
		writeUint(h, boolUint(m.Listed))
	}
	writeUint(h, uint64(len(m.Classes)))
	for _, c := range m.Classes {
		writeString(h, c)
	}
	writeUint(h, uint64(len(m.Samples)))
	for i := range m.Samples {
		s := &m.Samples[i]
		writeString(h, s.Path)
		writeUint(h, uint64(s.Label))
		writeUint(h, uint64(s.Size))
		if !v2 {
			continue
		}
		writeUint(h, uint64(s.Offset))
		if s.Tensor == nil {
			writeUint(h, 0)
			continue
		}
		writeUint(h, uint64(s.Tensor.DType))
		writeUint(h, uint64(len(s.Tensor.Shape)))
		for _, d := range s.Tensor.Shape {
			writeUint(h, uint64(d))
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:FingerprintLen/2])
}

func boolUint(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// writeUint writes v as 8 little-endian bytes.
func writeUint(h hash.Hash, v uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	h.Write(b[:])
}

// writeString writes s with its length first, so that no two lists of
// strings hash alike.
func writeString(h hash.Hash, s string) {
	writeUint(h, uint64(len(s)))
	h.Write([]byte(s))
}
