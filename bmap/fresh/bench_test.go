// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"context"
	"fmt"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

// BenchmarkOpen measures Open's checking pass over 4096 raw samples on a
// real ext4 (warm page cache): per sample an open, the identity check and
// FIEMAP, and the trust verdict (statx, the ACL xattr, a read lease taken
// and let go). Reported per sample: ns/sample.
func BenchmarkOpen(b *testing.B) {
	const n = 4096
	fs := testfs.New(b, testfs.Ext4())
	body := make([]byte, 8192)
	for i := range n {
		body[0] = byte(i)
		fs.WriteFile(b, fmt.Sprintf("train/c%d/%05d.jpg", i%16, i), body)
	}
	fs.Sync(b)
	m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		g, err := Open(m, Read, nil)
		if err != nil {
			b.Fatal(err)
		}
		if c := g.Counts(); c.Fresh != n {
			b.Fatalf("counts %+v", c)
		}
		g.Close()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/sample")
}
