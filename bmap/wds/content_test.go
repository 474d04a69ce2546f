// SPDX-License-Identifier: Apache-2.0

package wds

import (
	"path/filepath"
	"testing"
)

// TestContent: a webdataset's content is its samples', named by tar, key
// and members; a sample's size is its members' bytes, with no label.
func TestContent(t *testing.T) {
	p := filepath.Join(t.TempDir(), "m.bmap")
	writeSynthetic(t, p, 100, 3)
	m, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c, err := m.Content()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Samples != 100 || c.Labels != 0 || c.Len() != 64 {
		t.Fatalf("%d samples, %d labels, %d chunks", c.Samples, c.Labels, c.Len())
	}
	// Samples 0 and 9 (the .cls missing on every 10th) head chunks 0 and 6.
	for _, tc := range []struct {
		chunk int
		name  string
		size  int64
	}{{0, "part-00000.tar/0.{jpg,cls}", 1001}, {6, "part-00000.tar/9.jpg", 1000}} {
		s, ok := c.First(tc.chunk)
		if !ok || s.Name != tc.name || s.Size != tc.size || s.Label != -1 {
			t.Errorf("chunk %d's first: %+v, want %q (%d bytes, no label)", tc.chunk, s, tc.name, tc.size)
		}
	}
	again, _ := m.Content()
	if again.Digest != c.Digest {
		t.Fatalf("digests %s, %s of one map", c.Digest, again.Digest)
	}
}
