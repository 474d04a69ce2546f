// SPDX-License-Identifier: Apache-2.0

package bmap_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/extentinfo"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

var filefragLine = regexp.MustCompile(`^\s*\d+:\s+(\d+)\.\.\s*\d+:\s+(\d+)\.\.\s*\d+:\s+(\d+):`)

// filefrag returns the extents filefrag -v reports, in bytes.
func filefrag(t *testing.T, path string) []extentinfo.Extent {
	out, err := testfs.Command("filefrag", "-v", "-b1", path)
	if err != nil {
		t.Fatalf("filefrag %s: %v: %s", path, err, out)
	}
	var exts []extentinfo.Extent
	for _, line := range strings.Split(out, "\n") {
		m := filefragLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		l, _ := strconv.ParseUint(m[1], 10, 64)
		p, _ := strconv.ParseUint(m[2], 10, 64)
		n, _ := strconv.ParseUint(m[3], 10, 64)
		exts = append(exts, extentinfo.Extent{Logical: l, Physical: p, Length: n})
	}
	return exts
}

func TestMapRealFilesystems(t *testing.T) {
	for _, opts := range []testfs.Options{testfs.Ext4(), testfs.XFS()} {
		t.Run(opts.Type, func(t *testing.T) {
			fs := testfs.New(t, opts)
			testfs.Populate(t, fs, "train", 7)
			root := fs.Path("train")
			m, err := bmap.Build(context.Background(), root, bmap.BuildOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if m.Device.Path != fs.Dev || m.Device.FSType != opts.Type || m.Device.FSUUID == "" || m.Device.LogicalBlockSize == 0 {
				t.Errorf("device = %+v, want %s, %s, a UUID and a block size", m.Device, fs.Dev, opts.Type)
			}
			wantClasses := []string{"empty", "frag", "large", "prealloc", "sizes", "sparse"}
			if strings.Join(m.Classes, ",") != strings.Join(wantClasses, ",") {
				t.Errorf("classes = %q, want %q", m.Classes, wantClasses)
			}
			byPath := map[string]*bmap.Sample{}
			for i := range m.Samples {
				s := &m.Samples[i]
				byPath[s.Path] = s
				if m.Classes[s.Label] != filepath.Dir(s.Path) {
					t.Errorf("%s: label %d is class %s", s.Path, s.Label, m.Classes[s.Label])
				}
				fi, err := os.Stat(filepath.Join(root, s.Path))
				if err != nil || fi.Size() != s.Size {
					t.Errorf("%s: size %d, stat says %v %v", s.Path, s.Size, fi.Size(), err)
				}
				if s.Reason != bmap.Inline && s.Size > 0 {
					ff := filefrag(t, filepath.Join(root, s.Path))
					if len(ff) != len(s.Extents) {
						t.Errorf("%s: %d extents, filefrag says %d", s.Path, len(s.Extents), len(ff))
						continue
					}
					for j, e := range s.Extents {
						if e.Logical != ff[j].Logical || e.Physical != ff[j].Physical || e.Length != ff[j].Length {
							t.Errorf("%s: extent %d = %+v, filefrag says %+v", s.Path, j, e, ff[j])
						}
					}
				}
			}
			if len(m.Samples) != 16 {
				t.Errorf("%d samples, want 16", len(m.Samples))
			}
			// The test must have made what it claims to test.
			if s := byPath["frag/big0.jpg"]; s == nil || len(s.Extents) < 4 {
				t.Errorf("frag/big0.jpg is not fragmented: %+v", s)
			}
			if s := byPath["prealloc/p0.jpg"]; s == nil || s.Size != 256<<10 || !hasFlag(s, extentinfo.FlagUnwritten) {
				t.Errorf("prealloc/p0.jpg has no unwritten extent: %+v", s)
			}
			if s := byPath["sparse/s.png"]; s == nil || s.Extents[0].Logical+s.Extents[0].Length >= 1<<20 {
				t.Errorf("sparse/s.png has no hole: %+v", s)
			}
			if opts.Type == "ext4" {
				if s := byPath["sizes/f000060.jpg"]; s == nil || s.Reason != bmap.Inline {
					t.Errorf("60-byte file on ext4 with inline_data: %+v, want reason inline", s)
				}
			}
			// Every raw sample read from the device equals the file.
			rep, err := bmap.Verify(context.Background(), m, 4)
			if err != nil {
				t.Fatal(err)
			}
			st := m.Stats()
			if rep.Checked != st.Samples-st.FSOnly || len(rep.Differences) != 0 {
				t.Errorf("verify: checked %d of %d raw; differences %v", rep.Checked, st.Samples-st.FSOnly, rep.Differences)
			}
			// Cold: the same through a dropped page cache.
			if err := testfs.DropCaches(); err != nil {
				t.Logf("cannot drop caches: %v", err)
			} else if rep, err := bmap.Verify(context.Background(), m, 1); err != nil || len(rep.Differences) != 0 {
				t.Errorf("cold verify: %v %v", err, rep.Differences)
			}
			testFreshness(t, fs, m)
			testXNVMe(t, fs, m)
		})
	}
}

func hasFlag(s *bmap.Sample, f uint32) bool {
	for _, e := range s.Extents {
		if e.Flags&f != 0 {
			return true
		}
	}
	return false
}

func testFreshness(t *testing.T, fs *testfs.FS, m *bmap.Map) {
	p := func(rel string) string { return filepath.Join(m.Root, rel) }
	ck, err := m.NewChecker()
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	idx := map[string]int{}
	for i := range m.Samples {
		idx[m.Samples[i].Path] = i
		if err := ck.Check(i); err != nil {
			t.Errorf("fresh map: %v", err)
		}
	}
	time.Sleep(10 * time.Millisecond) // let timestamps move
	// Replaced file (new inode), rewritten in place (mtime), chmod (ctime),
	// truncated (size), deleted.
	os.Remove(p("large/a.jpg"))
	fs.WriteFile(t, "train/large/a.jpg", make([]byte, 12<<20))
	os.WriteFile(p("sizes/f004096.jpg"), make([]byte, 4096), 0o644)
	os.Chmod(p("sizes/f004097.jpg"), 0o600)
	os.Truncate(p("sizes/f110000.jpg"), 100)
	os.Remove(p("sizes/f000511.jpg"))
	for _, rel := range []string{"large/a.jpg", "sizes/f004096.jpg", "sizes/f004097.jpg", "sizes/f110000.jpg", "sizes/f000511.jpg"} {
		if err := ck.Check(idx[rel]); !errors.Is(err, bmap.ErrStale) || !strings.Contains(err.Error(), rel) {
			t.Errorf("%s changed: Check = %v, want ErrStale naming it", rel, err)
		}
	}
	if err := ck.Check(idx["large/b.JPEG"]); err != nil {
		t.Errorf("untouched file: %v", err)
	}
	// Verify must not read old extents of changed files.
	rep, err := bmap.Verify(context.Background(), m, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Differences) != 5 {
		t.Errorf("verify after changes: %d differences, want 5: %v", len(rep.Differences), rep.Differences)
	}
	// A map of another filesystem is refused as a whole.
	other := *m
	other.Device.FSUUID = "00000000-0000-0000-0000-000000000000"
	if _, err := other.NewChecker(); !errors.Is(err, bmap.ErrStale) {
		t.Errorf("wrong UUID: err = %v, want ErrStale", err)
	}
}

func testXNVMe(t *testing.T, fs *testfs.FS, old *bmap.Map) {
	m, err := bmap.Build(context.Background(), old.Root, bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	left, err := bmap.WriteXNVMe(&b, m)
	if err != nil {
		t.Fatal(err)
	}
	n := strings.Count(b.String(), "startblock")
	if n == 0 || left == 0 || n+left != len(m.Samples) {
		t.Fatalf("xnvme: %d written + %d left out != %d samples", n, left, len(m.Samples))
	}
	prefix := `"train/large/b.JPEG"`
	if !strings.Contains(b.String(), prefix) {
		t.Errorf("xnvme keys lack the root prefix %s", prefix)
	}
	// Every entry is what the example's generator reports (xfs_bmap's
	// first extent on xfs; the FIEMAP extent in whole blocks on ext4), and
	// a whole number of its 8-sector reads.
	var entries map[string]struct{ Startblock, Endblock uint64 }
	if err := json.Unmarshal([]byte(b.String()), &entries); err != nil {
		t.Fatal(err)
	}
	byKey := map[string]*bmap.Sample{}
	for i := range m.Samples {
		byKey["train/"+m.Samples[i].Path] = &m.Samples[i]
	}
	for k, e := range entries {
		if n := e.Endblock - e.Startblock + 1; n%8 != 0 {
			t.Errorf("%s: %d sectors, not a multiple of 8: the example's reader refuses it", k, n)
		}
		s := byKey[k]
		want := [2]uint64{s.Extents[0].Physical / 512, (s.Extents[0].Physical+s.Extents[0].Length)/512 - 1}
		if fs.Type == "xfs" {
			want = xfsBmapFirst(t, filepath.Join(m.Root, s.Path))
		}
		if [2]uint64{e.Startblock, e.Endblock} != want {
			t.Errorf("%s: [%d..%d], the example's generator says %v", k, e.Startblock, e.Endblock, want)
		}
	}
	_, rep, err := bmap.ImportXNVMe(context.Background(), []byte(b.String()), old.Root, bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Matched != n || rep.Mismatched != 0 || rep.Unknown != 0 || rep.Unlisted != left {
		t.Errorf("import of own export: %+v, want %d matched, %d unlisted", rep, n, left)
	}
	// An entry pointing at other blocks is never trusted.
	tampered := regexp.MustCompile(`("startblock": )(\d+)`).ReplaceAllString(b.String(), "${1}8")
	m2, rep, err := bmap.ImportXNVMe(context.Background(), []byte(tampered), old.Root, bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Mismatched != n || m2.Stats().FSOnlyReason[bmap.Mismatch] != n {
		t.Errorf("tampered import: %+v, want %d mismatched and marked", rep, n)
	}
}

// xfsBmapFirst returns the 512-byte block range of a file's first extent
// as xfs_bmap prints it ("0: [0..7]: 96..103").
func xfsBmapFirst(t *testing.T, path string) [2]uint64 {
	out, err := testfs.Command("xfs_bmap", path)
	if err != nil {
		t.Fatalf("xfs_bmap %s: %v: %s", path, err, out)
	}
	m := regexp.MustCompile(`(?m)^\s*0: \[\d+\.\.\d+\]: (\d+)\.\.(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("xfs_bmap %s: no first extent in %q", path, out)
	}
	a, _ := strconv.ParseUint(m[1], 10, 64)
	b, _ := strconv.ParseUint(m[2], 10, 64)
	return [2]uint64{a, b}
}

// Filesystems without device extents are refused with RequireExtents,
// else mapped filesystem-only.
func TestNoExtentFilesystems(t *testing.T) {
	for _, opts := range []testfs.Options{{Type: "btrfs"}, {Type: "tmpfs"}} {
		t.Run(opts.Type, func(t *testing.T) {
			fs := testfs.New(t, opts)
			fs.WriteFile(t, "c/x.jpg", []byte("data"))
			_, err := bmap.Build(context.Background(), fs.Dir, bmap.BuildOptions{RequireExtents: true})
			if !errors.Is(err, extentinfo.ErrUnsupportedFS) || !strings.Contains(err.Error(), opts.Type) {
				t.Errorf("RequireExtents: err = %v, want ErrUnsupportedFS naming %s", err, opts.Type)
			}
			m, err := bmap.Build(context.Background(), fs.Dir, bmap.BuildOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !m.FSOnly() || m.Device.FSType != opts.Type || len(m.Samples) != 1 || m.Samples[0].Reason != bmap.NoExtents {
				t.Errorf("map: FSOnly %v, device %+v, samples %+v", m.FSOnly(), m.Device, m.Samples)
			}
		})
	}
}
