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
	Samples int `json:"samples" msgpack:"samples"`
	// Labels is the number of distinct labels (0 for a webdataset).
	Labels int `json:"labels" msgpack:"labels"`
	// Digest is a SHA-256 of it all, 32 hex digits.
	Digest string `json:"digest" msgpack:"digest"`
	// Chunks holds 16 hex digits per chunk, one chunk after another.
	// There are k = min(Samples, ContentChunks) chunks.
	// Chunk i holds samples [i*Samples/k, (i+1)*Samples/k).
	Chunks string `json:"chunks" msgpack:"chunks"`
	// Names, Sizes and FirstLabels describe each chunk's first sample.
	// They are empty where the reader may not read them all.
	Names       []string `json:"names" msgpack:"names"`
	Sizes       []int64  `json:"sizes" msgpack:"sizes"`
	FirstLabels []int64  `json:"first_labels" msgpack:"first_labels"`
}

// chunkHex is the hex digits of one chunk's digest in Content.Chunks.
const chunkHex = 16

// ContentSample is one sample as a Content names it.
type ContentSample struct {
	Name  string // as the reader names it
	Size  int64  // its bytes
	Label int64  // its label; -1 for none
}

// Unnamed returns a copy of c that names no sample.
func (c Content) Unnamed() *Content {
	c.Names, c.Sizes, c.FirstLabels = nil, nil, nil
	return &c
}

// Len returns the number of chunks.
func (c *Content) Len() int { return len(c.Chunks) / chunkHex }

// Chunk returns chunk i's digest.
func (c *Content) Chunk(i int) string { return c.Chunks[i*chunkHex : (i+1)*chunkHex] }

// First returns chunk i's first sample, if c names it.
func (c *Content) First(i int) (ContentSample, bool) {
	if i >= len(c.Names) {
		return ContentSample{}, false
	}
	return ContentSample{Name: c.Names[i], Size: c.Sizes[i], Label: c.FirstLabels[i]}, true
}

// ContentDigester builds a Content from samples given in order.
// NewContentDigester makes one; Add each sample; Content ends it.
type ContentDigester struct {
	n, k, at, chunk int
	h               fingerprinter
	all             fingerprinter
	labels          map[int64]struct{}
	c               Content
}

// NewContentDigester starts a Content of n samples.
func NewContentDigester(n int) *ContentDigester {
	k := min(n, ContentChunks)
	d := &ContentDigester{n: n, k: k, labels: map[int64]struct{}{},
		h:   fingerprinter{h: sha256.New(), buf: make([]byte, 0, fingerprintBuf)},
		all: fingerprinter{h: sha256.New(), buf: make([]byte, 0, 64)},
		c:   Content{Samples: n, Names: make([]string, 0, k), Sizes: make([]int64, 0, k), FirstLabels: make([]int64, 0, k)}}
	d.all.bytes("nvfeed dataset content v1\x00")
	d.all.uint(uint64(n))
	return d
}

// chunkStart returns where chunk i of k starts among n samples.
func chunkStart(i, k, n int) int { return i * n / k }

// Add appends the next sample. A label below 0 means none.
func (d *ContentDigester) Add(name string, size, label int64) {
	k := d.k
	if d.chunk < k && d.at == chunkStart(d.chunk, k, d.n) {
		d.c.Names = append(d.c.Names, cut(name))
		d.c.Sizes = append(d.c.Sizes, size)
		d.c.FirstLabels = append(d.c.FirstLabels, label)
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
	d.c.Chunks += hex.EncodeToString(sum[:chunkHex/2])
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
// A numpy map's samples have no label.
func (m *Map) Content() Content {
	d := NewContentDigester(len(m.Samples))
	for i := range m.Samples {
		s := &m.Samples[i]
		label := int64(s.Label)
		if m.Reader == ReaderNumpy {
			label = -1
		}
		d.Add(s.Path, s.Size, label)
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
	k := c.Len()
	if o.Len() != k {
		return fmt.Sprintf("this node's copy has digest %s, %s %s", c.Digest, other, o.Digest)
	}
	for i := range k {
		if c.Chunk(i) == o.Chunk(i) {
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
	s, ok := c.First(i)
	if !ok {
		return ""
	}
	return fmt.Sprintf("; %s first there is %s", who, s)
}

// Validate checks a Content that came over the wire: its shape, not its sums.
func (c *Content) Validate() error {
	k := min(c.Samples, ContentChunks)
	switch {
	case c.Samples < 0 || c.Samples > 1<<31-1 || c.Labels < 0 || c.Labels > c.Samples:
		return fmt.Errorf("%d samples and %d labels", c.Samples, c.Labels)
	case !IsHex(c.Digest, FingerprintLen):
		return fmt.Errorf("digest %.64q is not %d hex digits", c.Digest, FingerprintLen)
	case !IsHex(c.Chunks, k*chunkHex):
		return fmt.Errorf("chunks of %d bytes for %d samples, want %d hex digits", len(c.Chunks), c.Samples, k*chunkHex)
	case (len(c.Names) != k && len(c.Names) != 0) || len(c.Sizes) != len(c.Names) || len(c.FirstLabels) != len(c.Names):
		return fmt.Errorf("%d names, %d sizes and %d labels for %d chunks, want none or one a chunk", len(c.Names), len(c.Sizes), len(c.FirstLabels), k)
	}
	for i, n := range c.Names {
		if len(n) > ContentNameMax {
			return fmt.Errorf("chunk %d's first name has %d bytes, at most %d", i, len(n), ContentNameMax)
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
