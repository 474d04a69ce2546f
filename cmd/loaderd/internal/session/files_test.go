// SPDX-License-Identifier: Apache-2.0

package session

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
)

// TestResolveFiles: files= names resolve to the map's samples in their
// order, relative to the root or absolute under it; names not in the map
// (outside the root, unmapped, escaping with ..) are refused naming the
// first and counting the rest, and the others are still given (to check
// access to them first).
func TestResolveFiles(t *testing.T) {
	ds := &bmap.Map{Root: "/data/nn", Samples: []bmap.Sample{{Path: "case_0_x.npy"}, {Path: "case_1_x.npy"}, {Path: "sub/case_2_x.npy"}}}
	tests := []struct {
		name  string
		files []string
		want  []int32
		err   string
		under []string // the missing names under the root
	}{
		{"relative, in order, repeats", []string{"sub/case_2_x.npy", "case_0_x.npy", "case_0_x.npy"}, []int32{2, 0, 0}, "", nil},
		{"absolute under the root", []string{"/data/nn/case_1_x.npy", "/data/nn/./sub/case_2_x.npy"}, []int32{1, 2}, "", nil},
		{"not mapped", []string{"case_0_x.npy", "case_0_y.npy", "/data/nn/sub/../nope"}, []int32{0}, `files: "case_0_y.npy" (and 1 more) is not a sample of dataset nn (mapped from /data/nn)`, []string{"case_0_y.npy", "nope"}},
		{"outside the root", []string{"/data/other/case_0_x.npy"}, []int32{}, `"/data/other/case_0_x.npy" is not a sample`, nil},
		{"escaping", []string{"../nn/case_0_x.npy"}, []int32{}, `"../nn/case_0_x.npy" is not a sample`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, under, err := resolveFiles("nn", ds, &fileIndex{}, tt.files)
			if !slices.Equal(got, tt.want) {
				t.Errorf("found %v, want %v", got, tt.want)
			}
			if !slices.Equal(under, tt.under) {
				t.Errorf("missing under the root %q, want %q", under, tt.under)
			}
			if tt.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("err %v, want ErrInvalid saying %q", err, tt.err)
			}
		})
	}
}

// TestResolveFilesCostsNoPassPerOpen: an open naming files costs a
// binary search per name in the dataset's index, built once: not a map
// of every path per open, which anyone who may connect could ask for
// again and again (at 1 281 167 samples 586 ms and 56 MB an open:
// `go test -run '^$' -bench BenchmarkResolveFiles ./cmd/loaderd/internal/session/`).
// A path the map lists twice resolves to its last entry, as before.
func TestResolveFilesCostsNoPassPerOpen(t *testing.T) {
	ds := bigMap(200_000)
	ds.Samples = append(ds.Samples, bmap.Sample{Path: "./c0001/s0000001.jpg"}) // twice: the last
	x := &fileIndex{}
	if got, _, err := resolveFiles("in", ds, x, []string{"c0001/s0000001.jpg", "/data/in/c0007/s0000007.jpg"}); err != nil || !slices.Equal(got, []int32{200_000, 7}) {
		t.Fatalf("resolve: %v %v, want [200000 7]", got, err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 20 {
		if _, _, err := resolveFiles("in", ds, x, []string{"nope.jpg"}); !errors.Is(err, ErrInvalid) {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / 20; per > 64<<10 {
		t.Errorf("an open naming one file allocates %d bytes over %d samples, want < 64 KiB", per, len(ds.Samples))
	}
}

// bigMap is a map of n samples in 1000 class folders.
func bigMap(n int) *bmap.Map {
	ds := &bmap.Map{Root: "/data/in", Samples: make([]bmap.Sample, n)}
	for i := range ds.Samples {
		ds.Samples[i].Path = fmt.Sprintf("c%04d/s%07d.jpg", i%1000, i)
	}
	return ds
}

// BenchmarkResolveFiles: an open naming one file, ImageNet's size.
func BenchmarkResolveFiles(b *testing.B) {
	ds, x := bigMap(1_281_167), &fileIndex{}
	resolveFiles("in", ds, x, nil)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		resolveFiles("in", ds, x, []string{"nope.jpg"})
	}
}
