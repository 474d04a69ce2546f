// SPDX-License-Identifier: Apache-2.0

package wds

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/extentinfo"
)

// shardsMap is a map of n tars of size bytes each, one extent each.
func shardsMap(n int, size int64) *bmap.Map {
	m := &bmap.Map{Version: 2, Root: "/data", Reader: bmap.ReaderFile, Listed: true}
	for i := range n {
		m.Samples = append(m.Samples, bmap.Sample{Path: fmt.Sprintf("part-%05d.tar", i), Size: size,
			Extents: []extentinfo.Extent{{Logical: 0, Physical: uint64(i) << 32, Length: uint64(size+4095) &^ 4095}}})
	}
	return m
}

// writeSynthetic writes a map of n samples over shards tars, each sample
// "k<i>" with a .jpg and a .cls (the .cls missing on every 10th).
func writeSynthetic(t testing.TB, path string, n, shards int) {
	t.Helper()
	w, err := NewWriter(path)
	if err != nil {
		t.Fatal(err)
	}
	per := (n + shards - 1) / shards
	names := make([]string, 2)
	offs, sizes := make([]int64, 2), make([]int64, 2)
	var key []byte
	for i := range n {
		if i%per == 0 {
			w.Shard(i / per)
		}
		local := int64(i % per)
		key = strconv.AppendInt(key[:0], int64(i), 10)
		names[0], names[1] = "x.jpg", "x.cls"
		offs[0], sizes[0] = local*3072+512, 1000
		offs[1], sizes[1] = local*3072+2048, 1
		c := 2
		if i%10 == 9 {
			c = 1
		}
		if err := w.Sample(string(key), names[:c], offs[:c], sizes[:c]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(shardsMap(shards, int64(per)*3072+1024)); err != nil {
		t.Fatal(err)
	}
}

func TestRoundTripAndSelect(t *testing.T) {
	p := filepath.Join(t.TempDir(), "m.bmap")
	writeSynthetic(t, p, 1000, 3)
	m, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
	if m.Len() != 1000 || m.Components() != 1900 || len(m.Shards.Samples) != 3 {
		t.Fatalf("%d samples, %d components, %d shards", m.Len(), m.Components(), len(m.Shards.Samples))
	}
	s, err := m.Sample(334)
	if err != nil || s.Key != "334" || s.Shard != 1 || s.Count != 2 {
		t.Fatalf("sample 334: %+v %v", s, err)
	}
	for _, tc := range []struct {
		o    Options
		n    int
		err  error
		at   int // a view sample
		want [2]int
	}{
		{Options{Ext: []string{"jpg", "cls"}, CaseSensitive: true}, 1000, nil, 9, [2]int{18, -1}},
		{Options{Ext: []string{"jpg", "cls"}, CaseSensitive: true, Missing: MissingSkip}, 900, nil, 9, [2]int{19, 20}},
		{Options{Ext: []string{"JPG;png", "cls"}, Missing: MissingSkip}, 900, nil, 899, [2]int{1897, 1898}},
		{Options{Ext: []string{"jpg", "cls"}, CaseSensitive: true, Missing: MissingError}, 0, ErrUnderfull, 0, [2]int{}},
	} {
		v, err := m.Select(tc.o)
		if !errors.Is(err, tc.err) {
			t.Fatalf("%+v: %v", tc.o, err)
		}
		if err != nil {
			continue
		}
		comps := make([]int, 2)
		if _, err := v.Sample(tc.at, comps); err != nil || v.Len() != tc.n || [2]int(comps) != tc.want {
			t.Errorf("%+v: %d samples, sample %d: %v %v, want %d %v", tc.o, v.Len(), tc.at, comps, err, tc.n, tc.want)
		}
		// Index agrees with a scan, and access does not allocate.
		if tc.o.Missing == MissingSkip {
			k := 0
			for i := range m.Len() {
				if i%10 != 9 {
					if got := v.Index(k); got != i {
						t.Fatalf("Index(%d) = %d, want %d", k, got, i)
					}
					k++
				}
			}
			if a := testing.AllocsPerRun(100, func() { v.Sample(777, comps) }); a != 0 {
				t.Errorf("View.Sample allocates %v times", a)
			}
		}
	}
}

// TestLoadRefusesVersion3: bmap.Load (versions 1 and 2) says what a
// version 3 map is instead of decoding it.
func TestLoadRefusesVersion3(t *testing.T) {
	p := filepath.Join(t.TempDir(), "m.bmap")
	writeSynthetic(t, p, 10, 1)
	if _, err := bmap.Load(p); !errors.Is(err, bmap.ErrWebDataset) {
		t.Fatalf("bmap.Load of a version 3 map: %v", err)
	}
}

// FuzzDecode: any bytes decode to a map whose every record access is
// checked, or an error; never a panic.
func FuzzDecode(f *testing.F) {
	p := filepath.Join(f.TempDir(), "m.bmap")
	writeSynthetic(f, p, 20, 2)
	b, _ := os.ReadFile(p)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			return
		}
		_ = m.Check()
		for i := range m.Len() {
			s, err := m.Sample(i)
			if err != nil {
				continue
			}
			for j := s.First; j < s.First+s.Count; j++ {
				_, _ = m.Component(s, j)
			}
		}
		if v, err := m.Select(Options{Ext: []string{"jpg", "cls"}, Missing: MissingSkip}); err == nil {
			c := make([]int, 2)
			for i := range v.Len() {
				_, _ = v.Sample(i, c)
			}
		}
	})
}

// TestScale writes a map of NVFEED_WDS_SAMPLES samples (100 M for the
// figures; skipped when unset) and measures its size, write time, Open
// time (the copy, its check and index) and the memory it costs, and
// selections.
func TestScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("NVFEED_WDS_SAMPLES"))
	if n == 0 {
		t.Skip("NVFEED_WDS_SAMPLES not set (100000000 for the 100 M figures)")
	}
	dir := os.Getenv("NVFEED_WDS_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	p := filepath.Join(dir, "scale.bmap")
	defer os.Remove(p)
	t0 := time.Now()
	writeSynthetic(t, p, n, max(1, n/10000))
	wrote := time.Since(t0)
	st, _ := os.Stat(p)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	t0 = time.Now()
	m, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	opened := time.Since(t0)
	runtime.GC()
	runtime.ReadMemStats(&after)
	defer m.Close()
	t0 = time.Now()
	v, err := m.Select(Options{Ext: []string{"jpg", "cls"}, CaseSensitive: true})
	if err != nil {
		t.Fatal(err)
	}
	comps := make([]int, 2)
	if _, err := v.Sample(n-1, comps); err != nil {
		t.Fatal(err)
	}
	first := time.Since(t0)
	t0 = time.Now()
	vs, err := m.Select(Options{Ext: []string{"jpg", "cls"}, CaseSensitive: true, Missing: MissingSkip})
	if err != nil {
		t.Fatal(err)
	}
	skip := time.Since(t0)
	t.Logf("%d samples (%d shards): %d bytes on disk (%.1f B/sample); written in %v (%.0f samples/s); Open (copy, check, index) %v, heap +%d KiB (the index %d KiB), its copy %d KiB; Select(empty)+Sample %v; Select(skip) %v for %d samples (bitmap %d KiB)",
		n, len(m.Shards.Samples), st.Size(), float64(st.Size())/float64(n), wrote, float64(n)/wrote.Seconds(), opened,
		(int64(after.HeapAlloc)-int64(before.HeapAlloc))/1024, m.IndexBytes()/1024, m.Bytes()/1024, first, skip, vs.Len(), (len(vs.keep)*8+len(vs.ranks)*4)/1024)
}
