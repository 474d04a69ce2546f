// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/extentinfo"
)

// synthMap makes an ImageNet-shaped map: n samples over 1000 classes, most
// with one extent, some fragmented, a few filesystem-only.
func synthMap(n int, seed uint64) *Map {
	rng := rand.New(rand.NewPCG(seed, 0))
	m := &Map{Version: Version, Root: "/data/train",
		Device: extentinfo.Device{Path: "/dev/nvme0n1p2", Major: 259, Minor: 2, Disk: "/dev/nvme0n1",
			PartitionStart: 1 << 20, LogicalBlockSize: 512, FSType: "ext4", FSUUID: "0b5e1a9e-7d6c-4c1e-9a55-3f0e2d6b8a11"}}
	nc := min(1000, max(1, n/10))
	for c := 0; c < nc; c++ {
		m.Classes = append(m.Classes, fmt.Sprintf("n%08d", 1440764+c))
	}
	phys := uint64(1 << 30)
	for i := 0; i < n; i++ {
		c := i * nc / n
		size := int64(rng.ExpFloat64()*110_000) + 1
		s := Sample{Path: fmt.Sprintf("%s/%s_%d.JPEG", m.Classes[c], m.Classes[c], i), Label: int32(c), Size: size,
			Inode: uint64(1000 + i), MtimeNs: 1_700_000_000_000_000_000 + int64(i), CtimeNs: 1_700_000_000_000_000_000 + int64(i)}
		blocks := (uint64(size) + 4095) &^ 4095
		switch r := rng.IntN(100); {
		case r < 90:
			s.Extents = []extentinfo.Extent{{Logical: 0, Physical: phys, Length: blocks, Flags: extentinfo.FlagLast}}
		case r < 98:
			half := (blocks / 2) &^ 4095
			s.Extents = []extentinfo.Extent{{Physical: phys, Length: half}, {Logical: half, Physical: phys + 3*blocks, Length: blocks - half, Flags: extentinfo.FlagLast}}
			if half == 0 {
				s.Extents = s.Extents[1:]
				s.Extents[0].Logical = 0
			}
		default:
			s.Extents = []extentinfo.Extent{{Physical: phys, Length: 4096, Flags: extentinfo.FlagDataInline | extentinfo.FlagNotAligned | extentinfo.FlagLast}}
			s.Reason = Inline
		}
		phys += 5 * blocks
		m.Samples = append(m.Samples, s)
	}
	return m
}

func encode(t testing.TB, m *Map, f Format) []byte {
	t.Helper()
	var b bytes.Buffer
	if _, err := Encode(&b, m, f); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 7, 1000} {
		m := synthMap(n, uint64(n))
		if n == 0 {
			m.Classes = []string{"empty"}
		}
		for _, f := range []Format{FormatBinary, FormatJSON} {
			t.Run(fmt.Sprintf("%s/%d", f, n), func(t *testing.T) {
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

func TestBinaryCorruptionDetected(t *testing.T) {
	b := encode(t, synthMap(20, 1), FormatBinary)
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
	if _, err := DecodeBinary(append(bytes.Clone(b), 0)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("trailing byte: err = %v", err)
	}
}

func TestValidateRejects(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(m *Map)
		want   string
	}{
		{"label out of range", func(m *Map) { m.Samples[0].Label = 99 }, "label 99"},
		{"path escapes", func(m *Map) { m.Samples[0].Path = m.Classes[0] + "/../../etc/passwd" }, "path"},
		{"path in other class", func(m *Map) { m.Samples[0].Path = "zzz/x.jpg" }, "path"},
		{"unaligned raw extent", func(m *Map) { m.Samples[0].Extents[0].Physical += 7 }, "aligned"},
		{"overlapping extents", func(m *Map) {
			s := &m.Samples[0]
			s.Extents = append(s.Extents, extentinfo.Extent{Logical: 0, Physical: 0, Length: 4096})
		}, "overlaps"},
		{"zero-length extent", func(m *Map) { m.Samples[0].Extents[0].Length = 0 }, "length"},
		{"relative root", func(m *Map) { m.Root = "data" }, "root"},
		{"bad class", func(m *Map) { m.Classes[0] = ".." }, "class"},
		{"wrong version", func(m *Map) { m.Version = 7 }, "version"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := synthMap(10, 3)
			m.Samples[0].Reason = Raw
			m.Samples[0].Extents = []extentinfo.Extent{{Physical: 8192, Length: 4096, Flags: 1}}
			tt.mutate(m)
			err := m.Validate()
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want ErrCorrupt mentioning %q", err, tt.want)
			}
			// Both decoders refuse what Validate refuses (the binary
			// format keeps the version in its header only).
			for _, f := range []Format{FormatBinary, FormatJSON} {
				if f == FormatBinary && m.Version != Version {
					continue
				}
				if _, err := Decode(encode(t, m, f)); !errors.Is(err, ErrCorrupt) {
					t.Errorf("%s decode: err = %v, want ErrCorrupt", f, err)
				}
			}
		})
	}
}

func TestDecodeDetectsXNVMe(t *testing.T) {
	if _, err := Decode([]byte(`{"train/a/x.jpg": {"startblock": 8, "endblock": 9}}`)); !errors.Is(err, ErrXNVMe) {
		t.Errorf("err = %v, want ErrXNVMe", err)
	}
	if _, err := Decode([]byte("garbage")); !errors.Is(err, ErrCorrupt) {
		t.Errorf("err = %v, want ErrCorrupt", err)
	}
}

func FuzzDecode(f *testing.F) {
	for i, n := range []int{0, 1, 3} {
		m := synthMap(n, uint64(i))
		if n == 0 {
			m.Classes = []string{"c"}
		}
		f.Add(encode(f, m, FormatBinary))
		f.Add(encode(f, m, FormatJSON))
	}
	for _, m := range []*Map{synthTensorMap(3, 1), synthListedMap(3), v1Map()} {
		f.Add(encode(f, m, FormatBinary))
		f.Add(encode(f, m, FormatJSON))
	}
	for _, name := range []string{"testdata/v1/train.bmap", "testdata/v1/train.json"} {
		if b, err := os.ReadFile(name); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			if m != nil {
				t.Fatal("non-nil map with error")
			}
			return
		}
		// Whatever decodes must be valid and survive a round trip.
		if err := m.Validate(); err != nil {
			t.Fatalf("decoded map fails validation: %v", err)
		}
		for _, f := range []Format{FormatBinary, FormatJSON} {
			m2, err := Decode(encode(t, m, f))
			if err != nil || !reflect.DeepEqual(m, m2) {
				t.Fatalf("re-encode round trip (%s): err=%v equal=%v", f, err, reflect.DeepEqual(m, m2))
			}
		}
	})
}

func TestSegments(t *testing.T) {
	E := func(l, p, n uint64, fl uint32) extentinfo.Extent {
		return extentinfo.Extent{Logical: l, Physical: p, Length: n, Flags: fl}
	}
	tests := []struct {
		name string
		size int64
		ext  []extentinfo.Extent
		want []Segment
	}{
		{"empty", 0, nil, nil},
		{"one extent clipped at eof", 5000, []extentinfo.Extent{E(0, 8192, 8192, 1)}, []Segment{{0, 8192, 5000, false}}},
		{"hole then data then tail hole", 20000, []extentinfo.Extent{E(4096, 40960, 4096, 1)},
			[]Segment{{0, 0, 4096, true}, {4096, 40960, 4096, false}, {8192, 0, 11808, true}}},
		{"contiguous extents merge", 8192, []extentinfo.Extent{E(0, 4096, 4096, 0), E(4096, 8192, 4096, 1)}, []Segment{{0, 4096, 8192, false}}},
		{"discontiguous stay apart", 8192, []extentinfo.Extent{E(0, 4096, 4096, 0), E(4096, 81920, 4096, 1)},
			[]Segment{{0, 4096, 4096, false}, {4096, 81920, 4096, false}}},
		{"unwritten reads zero", 10000, []extentinfo.Extent{E(0, 4096, 4096, 0), E(4096, 8192, 8192, extentinfo.FlagUnwritten|1)},
			[]Segment{{0, 4096, 4096, false}, {4096, 0, 5904, true}}},
		{"extent past eof ignored", 4096, []extentinfo.Extent{E(0, 4096, 4096, 0), E(8192, 81920, 4096, 1)}, []Segment{{0, 4096, 4096, false}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Sample{Size: tt.size, Extents: tt.ext}
			got := s.Segments(nil)
			for i := range got {
				if got[i].Zero {
					got[i].DevOff = 0
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// BenchmarkLoad1280k decodes a synthetic ImageNet-sized map (1.28 M
// samples) and reports the heap it holds per sample beyond its path.
func BenchmarkLoad1280k(b *testing.B) {
	const n = 1_281_167
	m := synthMap(n, 42)
	data := encode(b, m, FormatBinary)
	pathBytes := 0
	for i := range m.Samples {
		pathBytes += len(m.Samples[i].Path)
	}
	m = nil
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	var held float64
	for i := 0; i < b.N; i++ {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		got, err := DecodeBinary(data)
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		held = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)-int64(pathBytes)) / n
		runtime.KeepAlive(got)
	}
	b.ReportMetric(held, "B/sample-beyond-path")
	b.ReportMetric(float64(len(data))/n, "file-B/sample")
}

// TestVarintEdges: values on either side of a varint's one-byte form
// (what the decoder reads inline) decode as written, labels negative
// too, and the map decodes as its JSON does; cut short anywhere, it is
// ErrCorrupt.
func TestVarintEdges(t *testing.T) {
	m := synthListedMap(0)
	for i, v := range []int64{0, 1, 63, 64, 127, 128, 255, 16383, 16384, 1<<31 - 1} {
		for _, label := range []int32{int32(min(v, 1<<31-1)), -int32(min(v, 1<<31-1)) - 1} {
			m.Samples = append(m.Samples, Sample{Path: fmt.Sprintf("d/%d", len(m.Samples)), Label: label, Size: v, Inode: uint64(v),
				MtimeNs: v, CtimeNs: -v, Reason: Reason(i % int(numReasons)),
				Extents: []extentinfo.Extent{{Logical: 0, Physical: uint64(v) << 9, Length: 4096, Flags: uint32(v)}}})
		}
	}
	bin, js := encode(t, m, FormatBinary), encode(t, m, FormatJSON)
	got, err := Decode(bin)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Decode(js)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(got.Samples, m.Samples) {
		t.Fatalf("binary decode differs from JSON's or from the map written:\n%+v\n%+v", got.Samples, m.Samples)
	}
	p := bin[headerSize:]
	for n := range len(p) {
		if _, err := decodePayload(p[:n], m.Version); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("payload cut to %d of %d bytes: err %v, want ErrCorrupt", n, len(p), err)
		}
	}
}
