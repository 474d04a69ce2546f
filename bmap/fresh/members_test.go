// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/wds"
	"github.com/nvfeed/nvfeed/extentinfo"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

// wdsTar is a shard of n samples, each a .jpg of 3000 bytes (tag and
// index) and a .cls.
func wdsTar(t *testing.T, tag byte, n int) []byte {
	var b bytes.Buffer
	w := tar.NewWriter(&b)
	for i := range n {
		for _, m := range []struct {
			ext  string
			data []byte
		}{{"jpg", bytes.Repeat([]byte{tag, byte(i)}, 1500)}, {"cls", []byte(fmt.Sprint(i % 10))}} {
			if err := w.WriteHeader(&tar.Header{Name: fmt.Sprintf("%06d.%s", i, m.ext), Size: int64(len(m.data)), Mode: 0o644}); err != nil {
				t.Fatal(err)
			}
			w.Write(m.data)
		}
	}
	w.Close()
	return b.Bytes()
}

// TestMembersOnExt4: a webdataset map of tars on a real ext4 loop
// device: every member's bytes read from the device through its tar's
// extents are the member's (not its header or padding), and the guard's
// questions about a member answer for its tar: a tar rewritten in place,
// replaced by rename, or truncated fails every one of its members (Check
// wraps bmap.ErrStale), never the other tar's.
func TestMembersOnExt4(t *testing.T) {
	for _, change := range []string{"rewritten", "replaced", "truncated"} {
		t.Run(change, func(t *testing.T) {
			fs := testfs.New(t, testfs.Ext4())
			a, b := wdsTar(t, 'A', 20), wdsTar(t, 'B', 15)
			fs.WriteFile(t, "shards/a.tar", a)
			fs.WriteFile(t, "shards/b.tar", b)
			fs.Sync(t)
			out := filepath.Join(t.TempDir(), "m.bmap")
			if _, err := wds.Build(context.Background(), fs.Path("shards"), out, wds.BuildOptions{RequireExtents: true}); err != nil {
				t.Fatal(err)
			}
			m, err := wds.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			v, err := m.Select(wds.Options{Ext: []string{"jpg", "cls"}, CaseSensitive: true, Missing: wds.MissingError})
			if err != nil || v.Len() != 35 {
				t.Fatalf("%d samples, %v", v.Len(), err)
			}
			g, err := OpenWith(m.Shards, Options{Method: Watch})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			mem := Members{Guard: g, File: v.Shard}
			dev, err := os.Open(m.Shards.Device.Path)
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			comps := make([]int, 2)
			for i := range v.Len() {
				s, err := v.Sample(i, comps)
				if err != nil {
					t.Fatal(err)
				}
				if !mem.RawAllowed(i) || mem.Check(i) != nil {
					t.Fatalf("sample %d: raw %v, check %v", i, mem.RawAllowed(i), mem.Check(i))
				}
				tarBytes := map[int][]byte{0: a, 1: b}[s.Shard]
				c, _ := m.Component(s, comps[0])
				got := readRaw(t, dev, m.Shards.Samples[s.Shard].Extents, c.Offset, c.Size)
				if want := tarBytes[c.Offset : c.Offset+c.Size]; !bytes.Equal(got, want) || got[0] != "AB"[s.Shard] {
					t.Fatalf("sample %d (%s): device bytes %q… differ from the member's", i, s.Key, got[:8])
				}
			}
			p := fs.Path("shards/a.tar")
			switch change {
			case "rewritten":
				f, _ := os.OpenFile(p, os.O_WRONLY, 0)
				f.WriteAt([]byte("XX"), 1024)
				f.Sync()
				f.Close()
			case "replaced":
				fs.WriteFile(t, "shards/new.tar", a)
				if err := os.Rename(fs.Path("shards/new.tar"), p); err != nil {
					t.Fatal(err)
				}
			case "truncated":
				if err := os.Truncate(p, int64(len(a))-4096); err != nil {
					t.Fatal(err)
				}
			}
			g.Poll()
			for i := range v.Len() {
				err := mem.Check(i)
				if v.Shard(i) == 0 {
					if !mem.NeedStat(i) || !errors.Is(err, bmap.ErrStale) {
						t.Fatalf("sample %d of the %s tar: NeedStat %v, Check %v", i, change, mem.NeedStat(i), err)
					}
				} else if err != nil {
					t.Fatalf("sample %d of the other tar: %v", i, err)
				}
			}
		})
	}
}

// TestMembersUnknownFile: a sample whose file cannot be named is never
// fresh.
func TestMembersUnknownFile(t *testing.T) {
	mem := Members{Guard: &Guard{m: &bmap.Map{Samples: make([]bmap.Sample, 1)}}, File: func(int) int { return -1 }}
	if mem.RawAllowed(0) || !mem.NeedStat(0) || !errors.Is(mem.Check(0), ErrNoFile) || mem.PathUnchanged(0) {
		t.Fatal("a sample without a file is treated as fresh")
	}
}

// readRaw reads size bytes at offset off of a file with these extents
// straight from its device.
func readRaw(t *testing.T, dev *os.File, exts []extentinfo.Extent, off, size int64) []byte {
	t.Helper()
	out := make([]byte, 0, size)
	for _, e := range exts {
		lo, hi := max(off, int64(e.Logical)), min(off+size, int64(e.Logical+e.Length))
		if lo >= hi {
			continue
		}
		buf := make([]byte, hi-lo)
		if _, err := dev.ReadAt(buf, int64(e.Physical)+lo-int64(e.Logical)); err != nil {
			t.Fatal(err)
		}
		out = append(out, buf...)
	}
	if int64(len(out)) != size {
		t.Fatalf("extents cover %d of %d bytes", len(out), size)
	}
	return out
}
