// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/extentinfo"
)

// synthTensorMap makes a numpy map: n .npy files in the root and two
// subdirectories, of several types and shapes (0-d, empty, ragged), most
// raw with one extent, some fragmented, a few filesystem-only.
func synthTensorMap(n int, seed uint64) *Map {
	rng := rand.New(rand.NewPCG(seed, 1))
	m := &Map{Version: Version, Root: "/data/vol", Reader: ReaderNumpy,
		Device: extentinfo.Device{Path: "/dev/loop3", Major: 7, Minor: 3, Disk: "/dev/loop3", LogicalBlockSize: 512, FSType: "xfs", FSUUID: "u"}}
	shapes := [][]int64{nil, {0}, {3}, {2, 3}, {1, 4, 4}, {64, 64, 3}, {5, 0, 2}}
	phys := uint64(1 << 30)
	for i := 0; i < n; i++ {
		t := &Tensor{DType: npy.DType(1 + rng.IntN(14)), Shape: shapes[rng.IntN(len(shapes))]}
		s := Sample{Path: fmt.Sprintf("%s%05d.npy", []string{"", "s0/", "s1/"}[i%3], i), Tensor: t,
			Offset: 128, Size: t.NBytes(), Inode: uint64(100 + i), MtimeNs: int64(i), CtimeNs: int64(i)}
		blocks := (uint64(s.FileSize()) + 4095) &^ 4095
		switch r := rng.IntN(10); {
		case r < 7:
			s.Extents = []extentinfo.Extent{{Physical: phys, Length: blocks, Flags: extentinfo.FlagLast}}
		case r < 9 && blocks > 4096:
			s.Extents = []extentinfo.Extent{{Physical: phys, Length: 4096}, {Logical: 4096, Physical: phys + 2*blocks, Length: blocks - 4096, Flags: extentinfo.FlagLast}}
		default:
			s.Reason = NoExtents
		}
		phys += 4 * blocks
		m.Samples = append(m.Samples, s)
	}
	return m
}

// synthListedMap makes a listed fn.readers.file map: paths at any depth,
// labels of any sign, a path listed twice.
func synthListedMap(n int) *Map {
	m := &Map{Version: Version, Root: "/data/list", Reader: ReaderFile, Listed: true,
		Device: extentinfo.Device{Path: "/dev/sda1", Major: 8, Minor: 1, Disk: "/dev/sda", LogicalBlockSize: 4096, FSType: "ext4", FSUUID: "v"}}
	for i := 0; i < n; i++ {
		p := fmt.Sprintf("a/b%d/%d.jpg", i%4, i)
		if i == 3 {
			p = "a/b0/0.jpg" // DALI keeps duplicates
		}
		m.Samples = append(m.Samples, Sample{Path: p, Label: int32(i*7919%201) - 100, Size: int64(1000 + i),
			Extents: []extentinfo.Extent{{Physical: uint64(i+1) << 20, Length: 4096, Flags: extentinfo.FlagLast}}})
	}
	return m
}

func TestRoundTripV2(t *testing.T) {
	maps := map[string]*Map{
		"tensors/0": synthTensorMap(0, 1), "tensors/1": synthTensorMap(1, 2), "tensors/300": synthTensorMap(300, 3),
		"listed/0": synthListedMap(0), "listed/9": synthListedMap(9),
		"v1": v1Map(),
	}
	for name, m := range maps {
		if err := m.Validate(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, f := range []Format{FormatBinary, FormatJSON} {
			t.Run(fmt.Sprintf("%s/%s", f, name), func(t *testing.T) {
				got, err := Decode(encode(t, m, f))
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, m) {
					t.Errorf("round trip differs:\n got %+v\nwant %+v", got, m)
				}
			})
		}
	}
}

// TestV1EncodingStable: a version 1 map is still written byte for byte as
// the version 1 encoder wrote it, so older readers read it.
func TestV1EncodingStable(t *testing.T) {
	want, err := os.ReadFile("testdata/v1/train.bmap")
	if err != nil {
		t.Fatal(err)
	}
	if got := encode(t, v1Map(), FormatBinary); !bytes.Equal(got, want) {
		t.Errorf("version 1 encoding changed:\n got %x\nwant %x", got, want)
	}
	m := v1Map()
	m.Listed, m.Classes = true, nil
	for i := range m.Samples {
		m.Samples[i].Label = 0
	}
	var b bytes.Buffer
	if err := WriteBinary(&b, m); err == nil {
		t.Error("a listed map written as version 1")
	}
}

func TestMinVersion(t *testing.T) {
	if v := v1Map().MinVersion(); v != 1 {
		t.Errorf("folder layout: MinVersion = %d, want 1", v)
	}
	for name, m := range map[string]*Map{"tensors": synthTensorMap(3, 1), "listed": synthListedMap(3), "empty numpy": {Reader: ReaderNumpy}} {
		if v := m.MinVersion(); v != 2 {
			t.Errorf("%s: MinVersion = %d, want 2", name, v)
		}
	}
}

func TestV2CorruptionDetected(t *testing.T) {
	for _, m := range []*Map{synthTensorMap(6, 4), synthListedMap(4)} {
		b := encode(t, m, FormatBinary)
		for n := 0; n < len(b); n++ {
			if _, err := DecodeBinary(b[:n]); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("truncated to %d of %d bytes: err = %v, want ErrCorrupt", n, len(b), err)
			}
		}
		for bit := 0; bit < 8*len(b); bit++ {
			c := bytes.Clone(b)
			c[bit/8] ^= 1 << (bit % 8)
			if _, err := DecodeBinary(c); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("bit %d flipped: err = %v, want ErrCorrupt", bit, err)
			}
		}
	}
}

func TestValidateRejectsV2(t *testing.T) {
	tensor := func(mut func(s *Sample)) func(m *Map) {
		return func(m *Map) { mut(&m.Samples[0]) }
	}
	tests := []struct {
		name   string
		listed bool // mutate synthListedMap instead
		mutate func(m *Map)
		want   string
	}{
		{"shape disagrees with size", false, tensor(func(s *Sample) { s.Size++ }), "bytes, size says"},
		{"too many dimensions", false, tensor(func(s *Sample) { s.Tensor.Shape = make([]int64, MaxRank+1); s.Size = 0 }), "dimensions"},
		{"negative dimension", false, tensor(func(s *Sample) { s.Tensor.Shape = []int64{-1, -4}; s.Size = 4 * int64(s.Tensor.DType.ItemSize()) }), "negative"},
		{"overflowing shape", false, tensor(func(s *Sample) {
			s.Tensor = &Tensor{DType: npy.Float64, Shape: []int64{1 << 31, 1 << 31, 4}}
			s.Size = 0
		}), "overflow"},
		{"unknown dtype", false, tensor(func(s *Sample) { s.Tensor.DType = 99 }), "element type"},
		{"empty non-nil shape", false, tensor(func(s *Sample) {
			s.Tensor.Shape = []int64{}
			s.Size = int64(s.Tensor.DType.ItemSize())
		}), "non-nil"},
		{"no tensor", false, tensor(func(s *Sample) { s.Tensor = nil }), "no element type"},
		{"offset inside the prefix", false, tensor(func(s *Sample) { s.Offset = 10 }), "data offset"},
		{"offset past a v1 header", false, tensor(func(s *Sample) { s.Offset = MaxDataOffset + 1 }), "data offset"},
		{"offset plus size overflow", false, tensor(func(s *Sample) {
			s.Tensor = &Tensor{DType: npy.Uint8, Shape: []int64{math.MaxInt64 - 10}}
			s.Size = math.MaxInt64 - 10
		}), "overflow"},
		{"label on a tensor", false, tensor(func(s *Sample) { s.Label = 2 }), "label 2"},
		{"classes in a numpy map", false, func(m *Map) { m.Classes = []string{"a"} }, "classes"},
		{"path escapes", false, tensor(func(s *Sample) { s.Path = "../x.npy" }), "path"},
		{"path not clean", false, tensor(func(s *Sample) { s.Path = "s0/./x.npy" }), "path"},
		{"absolute path", false, tensor(func(s *Sample) { s.Path = "/etc/passwd" }), "path"},
		{"root as path", false, tensor(func(s *Sample) { s.Path = "." }), "path"},
		{"unknown reader", false, func(m *Map) { m.Reader = 7 }, "reader"},
		{"version 1 numpy map", false, func(m *Map) { m.Version = 1 }, "version 1 cannot"},
		{"version 3", false, func(m *Map) { m.Version = 3 }, "version 3"},
		{"tensor in a file map", true, func(m *Map) { m.Samples[0].Tensor = &Tensor{DType: npy.Uint8, Shape: []int64{m.Samples[0].Size}} }, "tensor"},
		{"offset in a file map", true, func(m *Map) { m.Samples[0].Offset = 128 }, "offset"},
		{"classes in a listed map", true, func(m *Map) { m.Classes = []string{"a"} }, "classes"},
		{"listed path escapes", true, func(m *Map) { m.Samples[1].Path = "a/../../b.jpg" }, "path"},
		{"version 1 listed map", true, func(m *Map) { m.Version = 1 }, "version 1 cannot"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := synthTensorMap(5, 9)
			if tt.listed {
				m = synthListedMap(4)
			}
			if err := m.Validate(); err != nil {
				t.Fatal(err)
			}
			tt.mutate(m)
			err := m.Validate()
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrCorrupt mentioning %q", err, tt.want)
			}
			// The decoders refuse what Validate refuses (the binary format
			// writes versions 1 and 2 only).
			if m.Version < 1 || m.Version > Version || m.MinVersion() > m.Version || tt.name == "empty non-nil shape" {
				return // not writable, or (an empty shape) written as a 0-d array's
			}
			for _, f := range []Format{FormatBinary, FormatJSON} {
				if _, err := Decode(encode(t, m, f)); !errors.Is(err, ErrCorrupt) {
					t.Errorf("%s decode: err = %v, want ErrCorrupt", f, err)
				}
			}
		})
	}
}

func TestSegmentsWithOffset(t *testing.T) {
	E := func(l, p, n uint64, fl uint32) extentinfo.Extent {
		return extentinfo.Extent{Logical: l, Physical: p, Length: n, Flags: fl}
	}
	tests := []struct {
		name      string
		off, size int64
		ext       []extentinfo.Extent
		want      []Segment
	}{
		{"data after a 128-byte header", 128, 1000, []extentinfo.Extent{E(0, 8192, 4096, 1)}, []Segment{{0, 8192 + 128, 1000, false}}},
		{"data straddles two extents", 128, 8000, []extentinfo.Extent{E(0, 8192, 4096, 0), E(4096, 40960, 8192, 1)},
			[]Segment{{0, 8192 + 128, 4096 - 128, false}, {4096 - 128, 40960, 8000 - 4096 + 128, false}}},
		{"header alone in the first extent", 4096, 100, []extentinfo.Extent{E(0, 8192, 4096, 0), E(4096, 40960, 4096, 1)},
			[]Segment{{0, 40960, 100, false}}},
		{"hole inside the data", 128, 12000, []extentinfo.Extent{E(0, 8192, 4096, 0), E(8192, 81920, 4096, 1)},
			[]Segment{{0, 8192 + 128, 3968, false}, {3968, 0, 4096, true}, {8064, 81920, 3936, false}}},
		{"header in a hole", 128, 100, []extentinfo.Extent{E(4096, 8192, 4096, 1)}, []Segment{{0, 0, 100, true}}},
		{"empty array", 128, 0, []extentinfo.Extent{E(0, 8192, 4096, 1)}, nil},
		{"unwritten data", 64, 100, []extentinfo.Extent{E(0, 8192, 4096, extentinfo.FlagUnwritten|1)}, []Segment{{0, 0, 100, true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Sample{Offset: tt.off, Size: tt.size, Extents: tt.ext}
			got := s.Segments(nil)
			for i := range got {
				if got[i].Zero {
					got[i].DevOff = 0
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
			var n uint64
			for _, g := range got {
				if g.FileOff != n {
					t.Errorf("segment at %d, want %d", g.FileOff, n)
				}
				n += g.Len
			}
			if n != uint64(tt.size) {
				t.Errorf("segments cover %d bytes, want %d", n, tt.size)
			}
		})
	}
}

func TestClassifyDataRange(t *testing.T) {
	inline := extentinfo.Extent{Physical: 0, Length: 4096, Flags: extentinfo.FlagDataInline | extentinfo.FlagNotAligned}
	data := extentinfo.Extent{Logical: 4096, Physical: 8192, Length: 4096, Flags: extentinfo.FlagLast}
	if r := classify(4096, 100, []extentinfo.Extent{inline, data}); r != Raw {
		t.Errorf("an inline header before raw data: %v, want raw", r)
	}
	if r := classify(128, 100, []extentinfo.Extent{inline, data}); r != Inline {
		t.Errorf("data in the inline extent: %v, want inline", r)
	}
}

func TestDirs(t *testing.T) {
	m := synthTensorMap(7, 1)
	m.Samples[0].Path = "s0/deep/x.npy"
	dirs, dirOf := m.Dirs()
	if strings.Join(dirs, ",") != ".,s0,s0/deep,s1" {
		t.Errorf("dirs = %q", dirs)
	}
	for i, s := range m.Samples {
		if want := strings.TrimSuffix(s.Path[:strings.LastIndexByte(s.Path, '/')+1], "/"); dirs[dirOf[i]] != want && !(want == "" && dirs[dirOf[i]] == ".") {
			t.Errorf("%s: dir %q", s.Path, dirs[dirOf[i]])
		}
	}
	dirs, dirOf = v1Map().Dirs()
	if !reflect.DeepEqual(dirs, v1Map().Classes) || dirOf[4] != 3 {
		t.Errorf("folder layout: dirs %q, dirOf %v", dirs, dirOf)
	}
}

func TestReaderNames(t *testing.T) {
	for r := ReaderFile; r < numReaders; r++ {
		if got, err := ParseReader(r.String()); err != nil || got != r {
			t.Errorf("%v: %v, %v", r, got, err)
		}
	}
	if _, err := ParseReader("tfrecord"); err == nil {
		t.Error("ParseReader(tfrecord) succeeded")
	}
}

func TestWriteXNVMeRefusesTensors(t *testing.T) {
	var b bytes.Buffer
	if _, err := WriteXNVMe(&b, synthTensorMap(2, 1)); err == nil || !strings.Contains(err.Error(), "numpy") {
		t.Errorf("err = %v", err)
	}
}
