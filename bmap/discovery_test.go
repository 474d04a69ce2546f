// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/nvfeed/nvfeed/bmap/npy"
)

// TestDiscoveryRemembered: a map made with filters records them
// (Map.Discovery), and Unmapped by the map's own (Discovered) counts only
// what that discovery would find now: x and y of each case in one folder,
// mapped apart with a file filter, each see only their own new files; a
// map made with DALI's defaults records nothing (version 1 stays
// version 1).
func TestDiscoveryRemembered(t *testing.T) {
	root := t.TempDir()
	files := map[string][]byte{}
	for i := range 3 {
		files[fmt.Sprintf("case_%d_x.npy", i)] = npyFile(t, npy.Float32, []int64{2}, false, nil)
		files[fmt.Sprintf("case_%d_y.npy", i)] = npyFile(t, npy.Int8, []int64{2}, false, nil)
	}
	writeFiles(t, root, files)
	xs, err := Build(context.Background(), root, BuildOptions{Reader: ReaderNumpy, DiscoverOptions: DiscoverOptions{FileFilter: "*_x.npy"}})
	if err != nil {
		t.Fatal(err)
	}
	if xs.Discovery == nil || xs.Discovery.FileFilter != "*_x.npy" {
		t.Fatalf("Discovery %+v, want the file filter", xs.Discovery)
	}
	if n, err := xs.Unmapped(xs.Discovered()); err != nil || n != 0 {
		t.Errorf("right after mapping: %d unmapped, %v", n, err)
	}
	writeFiles(t, root, map[string][]byte{"case_3_x.npy": npyFile(t, npy.Float32, []int64{2}, false, nil),
		"case_3_y.npy": npyFile(t, npy.Int8, []int64{2}, false, nil)})
	if n, err := xs.Unmapped(xs.Discovered()); err != nil || n != 1 {
		t.Errorf("one new x, one new y: %d unmapped by the map's filter, %v; want 1", n, err)
	}
	// Through both formats, the record survives.
	for _, f := range []Format{FormatBinary, FormatJSON} {
		got, err := Decode(encode(t, xs, f))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.Discovery, xs.Discovery) {
			t.Errorf("%s: Discovery %+v after a round trip, want %+v", f, got.Discovery, xs.Discovery)
		}
	}

	// fn.readers.file's filters, and a map with the defaults.
	froot := t.TempDir()
	writeFiles(t, froot, map[string][]byte{"a/1.jpg": []byte("j"), "a/2.png": []byte("p")})
	jpg, err := Build(context.Background(), froot, BuildOptions{DiscoverOptions: DiscoverOptions{Filters: []string{"*.jpg"}, CaseSensitive: true}})
	if err != nil {
		t.Fatal(err)
	}
	if jpg.Version != 2 || jpg.Discovery == nil || !jpg.Discovery.CaseSensitive {
		t.Errorf("filtered file map: version %d, Discovery %+v", jpg.Version, jpg.Discovery)
	}
	writeFiles(t, froot, map[string][]byte{"a/3.png": []byte("p"), "a/4.JPG": []byte("j")})
	if n, err := jpg.Unmapped(jpg.Discovered()); err != nil || n != 0 {
		t.Errorf("new .png and .JPG beside a case-sensitive *.jpg map: %d unmapped, %v; want 0", n, err)
	}
	got, err := Decode(encode(t, jpg, FormatBinary))
	if err != nil || !reflect.DeepEqual(got, jpg) {
		t.Errorf("binary round trip: %v\n got %+v\nwant %+v", err, got, jpg)
	}
	def, err := Build(context.Background(), froot, BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if def.Version != 1 || def.Discovery != nil {
		t.Errorf("default filters: version %d, Discovery %+v; want version 1, none", def.Version, def.Discovery)
	}
}

// TestDiscoveryLayout: a version 2 map without Discovery encodes as
// before the field existed (flags without bit 1, nothing after them), so
// older builds still read every map made with DALI's default filters.
func TestDiscoveryLayout(t *testing.T) {
	m := synthMap(5, 3)
	m.Listed = true
	m.Classes = nil
	plain := encode(t, m, FormatBinary)
	m.Discovery = &DiscoverOptions{FileFilter: "*_x.npy"}
	with := encode(t, m, FormatBinary)
	if len(with) <= len(plain) || bytes.Equal(plain[headerSize:], with[headerSize:]) {
		t.Fatalf("Discovery changed nothing in the layout")
	}
	m.Discovery = nil
	if !bytes.Equal(plain, encode(t, m, FormatBinary)) {
		t.Errorf("encoding is not stable")
	}
}
