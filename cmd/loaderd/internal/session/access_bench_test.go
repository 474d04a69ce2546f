// SPDX-License-Identifier: Apache-2.0

package session

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

// BenchmarkAuthorizeCached: an open's access decision for a caller whose
// verdict is cached, over a 1000-file ext4 dataset with a Watch guard
// (the decision includes the guard's poll and generation, and the
// ancestors' re-stat).
func BenchmarkAuthorizeCached(b *testing.B) {
	fs := testfs.New(b, testfs.Ext4())
	for d := fs.Dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	for i := range 1000 {
		fs.WriteFile(b, fmt.Sprintf("train/c%02d/%04d.jpg", i%10, i), bytes.Repeat([]byte("x"), 8192))
	}
	fs.Sync(b)
	m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		b.Fatal(err)
	}
	g, err := fresh.Open(m, fresh.Watch, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	v := newVerdicts()
	c := Caller{UID: nobody, GID: nobody}
	if err := v.authorize("ds", 1, m, g, c); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := v.authorize("ds", 1, m, g, c); err != nil {
			b.Fatal(err)
		}
	}
}
