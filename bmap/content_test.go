// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"regexp"
	"strings"
	"testing"
)

// TestContent: another copy's layout keeps the content; a changed
// name, size or label is named by the chunk it falls in.
func TestContent(t *testing.T) {
	for _, n := range []int{0, 1, 40, 64, 65, 200, 1000} {
		m := synthMap(n, 1)
		c := m.Content()
		k := min(n, ContentChunks)
		if c.Samples != n || c.Len() != k || len(c.Names) != k || !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(c.Digest) {
			t.Fatalf("n=%d: content %d samples, %d chunks, %d names, digest %q", n, c.Samples, c.Len(), len(c.Names), c.Digest)
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		for i := range k {
			if at := chunkStart(i, k, n); c.Names[i] != m.Samples[at].Path {
				t.Fatalf("n=%d: chunk %d's first is %q, sample %d is %q", n, i, c.Names[i], at, m.Samples[at].Path)
			}
		}
	}
	base := synthMap(200, 1)
	want := base.Content()
	for _, tc := range []struct {
		name string
		edit func(m *Map)
		diff string // "" when the same
	}{
		{"another node's layout", func(m *Map) {
			m.Root, m.Device.FSType = "/mnt/xfs", "xfs"
			for i := range m.Samples {
				m.Samples[i].Extents, m.Samples[i].Inode = nil, uint64(i+7)
			}
		}, ""},
		{"a sample's size", func(m *Map) { m.Samples[7].Size++ }, `samples 6-8 differ; this node's first there is "n01440764/n01440764_6.JPEG"`},
		{"a sample renamed", func(m *Map) { m.Samples[199].Path += "x" }, `samples 196-199 differ; this node's first there is "n01440783/n01440783_196.JPEG"`},
		{"a label", func(m *Map) { m.Samples[9].Label++ }, `samples 9-11 differ`},
		{"a sample less", func(m *Map) { m.Samples = m.Samples[:199] }, "this node's copy has 199 samples, node A's 200"},
		{"every label one", func(m *Map) {
			for i := range m.Samples {
				m.Samples[i].Label = 0
			}
		}, "this node's copy has 1 labels, node A's 20"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := *base
			m.Samples = append([]Sample(nil), base.Samples...)
			tc.edit(&m)
			got := m.Content().Diff(want, "node A's")
			if (tc.diff == "") != (got == "") || !strings.Contains(got, tc.diff) {
				t.Fatalf("diff %q, want one with %q", got, tc.diff)
			}
		})
	}
}

// TestContentOneChunkASample: a small dataset names the very sample.
func TestContentOneChunkASample(t *testing.T) {
	m := synthMap(20, 1)
	want := m.Content()
	m.Samples[13].Size = 5
	got := m.Content().Diff(want, "rank 0's")
	if !strings.HasPrefix(got, `sample 13 differs; this node's first there is "n01440765/n01440765_13.JPEG" (5 bytes, label 1); rank 0's first there is `) {
		t.Fatalf("diff %q", got)
	}
}

// TestContentNameCut: a long name is cut in Firsts, not in the digest.
func TestContentNameCut(t *testing.T) {
	m := synthMap(3, 1)
	m.Samples[0].Path = strings.Repeat("a", 1000)
	c := m.Content()
	m.Samples[0].Path = strings.Repeat("a", 999) + "b"
	if len(c.Names[0]) != ContentNameMax || c.Digest == m.Content().Digest {
		t.Fatalf("first %d bytes; digests %s %s", len(c.Names[0]), c.Digest, m.Content().Digest)
	}
}
