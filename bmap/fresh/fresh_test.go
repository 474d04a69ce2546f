// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/extentinfo"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

// TestOpenRefusesForgedExtents: a map whose extents for a sample are not
// the file's own (a map written by a user, pointing its sample at another
// file's blocks) marks that sample changed at open, so it is never read
// raw; the others stay readable; CheckFd of the live file says
// bmap.ErrExtents.
func TestOpenRefusesForgedExtents(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	fs.WriteFile(t, "train/a/mine.jpg", bytes.Repeat([]byte("MINE"), 3000))
	fs.WriteFile(t, "train/a/other.jpg", bytes.Repeat([]byte("OTHR"), 3000))
	fs.WriteFile(t, "secret.dat", bytes.Repeat([]byte("SECRET!!"), 4096))
	fs.Sync(t)
	m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(fs.Path("secret.dat"))
	var mp extentinfo.Mapper
	exts, err := mp.Extents(f)
	f.Close()
	if err != nil || len(exts) == 0 {
		t.Fatalf("FIEMAP of the secret: %v %v", exts, err)
	}
	for _, tc := range []struct {
		name  string
		forge func(s *bmap.Sample)
	}{
		{"another file's blocks", func(s *bmap.Sample) { s.Extents[0].Physical = exts[0].Physical }},
		{"one block off", func(s *bmap.Sample) { s.Extents[0].Physical += 4096 }},
		{"marked unwritten (reads as zeros)", func(s *bmap.Sample) { s.Extents[0].Flags |= extentinfo.FlagUnwritten }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forged := *m
			forged.Samples = append([]bmap.Sample(nil), m.Samples...)
			s := &forged.Samples[0]
			s.Extents = append([]extentinfo.Extent(nil), s.Extents...)
			tc.forge(s)
			g, err := Open(&forged, Watch, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if !g.ChangedAtOpen(0) {
				t.Errorf("the forged sample may be read raw")
			}
			if g.ChangedAtOpen(1) {
				t.Errorf("the honest sample was marked")
			}
			fd, err := unix.Open(fs.Path("train", s.Path), unix.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			if err := g.CheckFd(0, fd); !errors.Is(err, bmap.ErrExtents) {
				t.Errorf("CheckFd of the forged sample: %v, want ErrExtents", err)
			}
		})
	}
}

// TestCounts: the stat pass's and the watch's changes are counted stale,
// the unchanged raw samples fresh, the non-raw ones filesystem-only, for
// either method.
func TestCounts(t *testing.T) {
	for _, method := range []string{Watch, Read} {
		t.Run(method, func(t *testing.T) {
			fs := testfs.New(t, testfs.Ext4())
			for _, p := range []string{"a/1.jpg", "a/2.jpg", "a/3.jpg", "b/1.jpg", "b/2.jpg"} {
				fs.WriteFile(t, "train/"+p, bytes.Repeat([]byte(p), 3000))
			}
			fs.WriteFile(t, "train/b/tiny.jpg", []byte("x"))
			fs.Sync(t)
			m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
			if err != nil {
				t.Fatal(err)
			}
			last := &m.Samples[len(m.Samples)-1] // filesystem-only, whatever the filesystem made of it
			last.Reason, last.Extents = bmap.Inline, nil
			// Changed before Open (the map's times no longer match): found by the stat pass.
			m.Samples[0].MtimeNs++
			g, err := Open(m, method, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if got, want := g.Counts(), (Counts{Fresh: 4, Stale: 1, FSOnly: 1}); got != want {
				t.Fatalf("at open: %+v, want %+v", got, want)
			}
			// Changed after Open: seen by the watch (Read: by the stat).
			if err := os.Chmod(fs.Path("train", m.Samples[3].Path), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, step := range []string{"after a change", "again"} {
				if got, want := g.Counts(), (Counts{Fresh: 3, Stale: 2, FSOnly: 1}); got != want {
					t.Fatalf("%s: %+v, want %+v", step, got, want)
				}
			}
		})
	}
}

// TestGuardNumpyDirs: a numpy map's samples (in the root and in
// subdirectories, no classes) are watched by directory: a change in one
// makes only its samples need a stat.
func TestGuardNumpyDirs(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	for _, p := range []string{"vol/a.npy", "vol/s/b.npy", "vol/t/c.npy"} {
		fs.WriteFile(t, p, npyBytes(t))
	}
	fs.Sync(t)
	m, err := bmap.Build(context.Background(), fs.Path("vol"), bmap.BuildOptions{Reader: bmap.ReaderNumpy})
	if err != nil {
		t.Fatal(err)
	}
	g, err := Open(m, Watch, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	g.Poll()
	for i := range m.Samples {
		if g.NeedStat(i) || !g.PathUnchanged(i) {
			t.Fatalf("sample %d needs a stat before anything happened", i)
		}
	}
	if err := os.Chmod(fs.Path("vol/s/b.npy"), 0o600); err != nil {
		t.Fatal(err)
	}
	g.Poll()
	for i, want := range []bool{false, true, false} {
		if g.NeedStat(i) != want {
			t.Errorf("%s: NeedStat = %v, want %v", m.Samples[i].Path, g.NeedStat(i), want)
		}
	}
}

// npyBytes is a small .npy file: a version 1.0 header and 4 int32.
func npyBytes(t *testing.T) []byte {
	b, err := npy.Encode(npy.Header{DType: npy.Int32, Shape: []int64{4}})
	if err != nil {
		t.Fatal(err)
	}
	return append(b, make([]byte, 16)...)
}
