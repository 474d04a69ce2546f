// SPDX-License-Identifier: Apache-2.0

package bmap_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

// BenchmarkBuild20k maps a 20 000-file dataset on an ext4 loop image with a
// warm inode cache and reports samples/s.
func BenchmarkBuild20k(b *testing.B) {
	fs := testfs.New(b, testfs.Options{Type: "ext4", SizeMB: 1024})
	data := make([]byte, 6000)
	for c := 0; c < 100; c++ {
		dir := fs.Path("train", fmt.Sprintf("n%08d", c))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		for i := 0; i < 200; i++ {
			if err := os.WriteFile(fmt.Sprintf("%s/img_%06d.JPEG", dir, i), data, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	fs.Sync(b)
	root := fs.Path("train")
	if _, err := bmap.Build(context.Background(), root, bmap.BuildOptions{}); err != nil { // warm the inode cache
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m, err := bmap.Build(context.Background(), root, bmap.BuildOptions{})
		if err != nil || len(m.Samples) != 20000 {
			b.Fatalf("%v, %d samples", err, len(m.Samples))
		}
	}
	b.ReportMetric(float64(20000*b.N)/b.Elapsed().Seconds(), "samples/s")
}
