// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// ContentChunks is how many chunks a Content cuts the sample order into.
// A dataset of fewer samples has one chunk a sample.
const ContentChunks = 64

// ContentNameMax is the most bytes of a name a ContentSample keeps.
// A longer name is cut there and marked with "...".
const ContentNameMax = 256

// Content summarises a dataset by what its reader serves, not by where
// its bytes lie. It covers each sample's name, size and label, in sample
// order. Two copies of a dataset on two filesystems have one Content.
// Its size does not grow with the dataset.
type Content struct {
	// Samples is the number of samples.
	Samples int `msgpack:"samples"`
	// Labels is the number of distinct labels (0 for a webdataset).
	Labels int `msgpack:"labels"`
	// Digest is a SHA-256 of it all, 32 hex digits.
	Digest string `msgpack:"digest"`
	// Chunks holds one digest of 16 hex digits per chunk.
	// Chunk i holds samples [i*Samples/len, (i+1)*Samples/len).
	Chunks []string `msgpack:"chunks"`
	// Firsts holds each chunk's first sample.
	// It is empty where the reader may not read them all.
	Firsts []ContentSample `msgpack:"firsts"`
}

// ContentSample is one sample as a Content names it.
type ContentSample struct {
	Name  string `msgpack:"name"`  // as the reader names it
	Size  int64  `msgpack:"size"`  // its bytes
	Label int64  `msgpack:"label"` // its label; -1 for none
}

// ContentDigester builds a Content from samples given in order.
// NewContentDigester makes one; Add each sample; Content ends it.
type ContentDigester struct {
	n, at, chunk int
	h            fingerprinter
	all          fingerprinter
	labels       map[int64]struct{}
	c            Content
}

// NewContentDigester starts a Content of n samples.
func NewContentDigester(n int) *ContentDigester {
	k := min(n, ContentChunks)
	d := &ContentDigester{n: n, labels: map[int64]struct{}{},
		h:   fingerprinter{h: sha256.New(), buf: make([]byte, 0, fingerprintBuf)},
		all: fingerprinter{h: sha256.New(), buf: make([]byte, 0, 64)},
		c:   Content{Samples: n, Chunks: make([]string, 0, k), Firsts: make([]ContentSample, 0, k)}}
	d.all.bytes("nvfeed dataset content v1\x00")
	d.all.uint(uint64(n))
	return d
}

// chunkStart returns where chunk i of k starts among n samples.
func chunkStart(i, k, n int) int { return i * n / k }

// Add appends the next sample. A label below 0 means none.
func (d *ContentDigester) Add(name string, size, label int64) {
	k := cap(d.c.Chunks)
	if d.at == chunkStart(d.chunk, k, d.n) && d.chunk < k {
		d.c.Firsts = append(d.c.Firsts, ContentSample{Name: cut(name), Size: size, Label: label})
		d.chunk++
	}
	d.h.string(name)
	d.h.uint(uint64(size))
	d.h.uint(uint64(label))
	if label >= 0 {
		d.labels[label] = struct{}{}
	}
	d.at++
	if d.at == chunkStart(d.chunk, k, d.n) || d.at == d.n {
		d.endChunk()
	}
}

// endChunk closes the chunk being hashed.
func (d *ContentDigester) endChunk() {
	sum := d.h.sum()
	d.all.bytes(string(sum))
	d.c.Chunks = append(d.c.Chunks, hex.EncodeToString(sum[:8]))
	d.h.h.Reset()
}

// Content returns the summary of the samples added.
// It panics unless every sample promised was added.
func (d *ContentDigester) Content() Content {
	if d.at != d.n {
		panic(fmt.Sprintf("bmap: content of %d samples given %d", d.n, d.at))
	}
	d.c.Labels = len(d.labels)
	d.all.uint(uint64(d.c.Labels))
	d.c.Digest = hex.EncodeToString(d.all.sum()[:FingerprintLen/2])
	return d.c
}

// cut shortens a name to ContentNameMax bytes.
func cut(name string) string {
	if len(name) <= ContentNameMax {
		return name
	}
	return name[:ContentNameMax-3] + "..."
}

// Content summarises m's samples: path, size and label, in order.
func (m *Map) Content() Content {
	d := NewContentDigester(len(m.Samples))
	for i := range m.Samples {
		s := &m.Samples[i]
		d.Add(s.Path, s.Size, int64(s.Label))
	}
	return d.Content()
}

// Diff names where c, this node's, differs from o, other's.
// other is possessive: "rank 0's", "the state's".
// It returns "" when they agree.
func (c Content) Diff(o Content, other string) string {
	if c.Digest == o.Digest {
		return ""
	}
	if c.Samples != o.Samples {
		return fmt.Sprintf("this node's copy has %d samples, %s %d", c.Samples, other, o.Samples)
	}
	if c.Labels != o.Labels {
		return fmt.Sprintf("this node's copy has %d labels, %s %d", c.Labels, other, o.Labels)
	}
	k := len(c.Chunks)
	if len(o.Chunks) != k {
		return fmt.Sprintf("this node's copy has digest %s, %s %s", c.Digest, other, o.Digest)
	}
	for i := range k {
		if c.Chunks[i] == o.Chunks[i] {
			continue
		}
		lo, hi := chunkStart(i, k, c.Samples), chunkStart(i+1, k, c.Samples)-1
		where := fmt.Sprintf("sample %d differs", lo)
		if hi > lo {
			where = fmt.Sprintf("samples %d-%d differ", lo, hi)
		}
		return where + c.first(i, "this node's") + o.first(i, other)
	}
	return fmt.Sprintf("this node's copy has digest %s, %s %s", c.Digest, other, o.Digest)
}

// first names chunk i's first sample, as who has it, if c names it.
func (c Content) first(i int, who string) string {
	if i >= len(c.Firsts) {
		return ""
	}
	return fmt.Sprintf("; %s first there is %s", who, c.Firsts[i])
}

// Validate checks a Content that came over the wire: its shape, not its sums.
func (c *Content) Validate() error {
	k := min(c.Samples, ContentChunks)
	switch {
	case c.Samples < 0 || c.Labels < 0 || c.Labels > c.Samples:
		return fmt.Errorf("%d samples and %d labels", c.Samples, c.Labels)
	case !IsHex(c.Digest, FingerprintLen):
		return fmt.Errorf("digest %.64q is not %d hex digits", c.Digest, FingerprintLen)
	case len(c.Chunks) != k || (len(c.Firsts) != k && len(c.Firsts) != 0):
		return fmt.Errorf("%d chunks and %d firsts for %d samples, want %d", len(c.Chunks), len(c.Firsts), c.Samples, k)
	}
	for i, d := range c.Chunks {
		if !IsHex(d, 16) {
			return fmt.Errorf("chunk %d's digest %.64q is not 16 hex digits", i, d)
		}
		if len(c.Firsts[i].Name) > ContentNameMax {
			return fmt.Errorf("chunk %d's first name has %d bytes, at most %d", i, len(c.Firsts[i].Name), ContentNameMax)
		}
	}
	return nil
}

// IsHex reports whether s is n lowercase hex digits.
func IsHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, r := range s {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return false
		}
	}
	return true
}

// String names the sample: 'n01/x.JPEG' (12345 bytes, label 3).
func (s ContentSample) String() string {
	if s.Label < 0 {
		return fmt.Sprintf("%q (%d bytes)", s.Name, s.Size)
	}
	return fmt.Sprintf("%q (%d bytes, label %d)", s.Name, s.Size, s.Label)
}
