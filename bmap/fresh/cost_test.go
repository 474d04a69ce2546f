// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

// BenchmarkOpenGuard: a Watch guard's start (the checking pass, and the
// filesystem-wide watch's index) over NVFEED_GUARD_FILES files (default
// 20000) of 4 KiB on ext4; reports the heap the guard keeps per sample.
func BenchmarkOpenGuard(b *testing.B) {
	n := 20000
	if s := os.Getenv("NVFEED_GUARD_FILES"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	fs := testfs.New(b, testfs.Options{Type: "ext4", SizeMB: 1024, MkfsArgs: []string{"-b", "4096", "-N", strconv.Itoa(n + 1000)}})
	body := make([]byte, 4096)
	for i := range n {
		fs.WriteFile(b, fmt.Sprintf("train/c%03d/%06d.jpg", i%100, i), body)
	}
	fs.Sync(b)
	m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		b.Fatal(err)
	}
	var kept float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		g, err := Open(m, Watch, nil)
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		kept = float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
		runtime.KeepAlive(g)
		g.Close()
	}
	b.ReportMetric(kept, "heapB/sample")
}
