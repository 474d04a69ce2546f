// SPDX-License-Identifier: Apache-2.0

package session

import (
	"errors"
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
			got, under, err := resolveFiles("nn", ds, tt.files)
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
