// SPDX-License-Identifier: Apache-2.0

package wds

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"strings"
	"testing"
)

type entry struct {
	name string
	typ  byte
	data string
}

func mkTar(t testing.TB, format tar.Format, ents ...entry) []byte {
	t.Helper()
	var b bytes.Buffer
	w := tar.NewWriter(&b)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Size: int64(len(e.data)), Mode: 0o644, Format: format}
		if e.typ != tar.TypeReg {
			h.Size = 0
			h.Linkname = "target"
		}
		if err := w.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			if _, err := w.Write([]byte(e.data)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestReadTar(t *testing.T) {
	long := strings.Repeat("d", 90) + "/" + strings.Repeat("k", 40) + ".jpg"
	for _, tc := range []struct {
		name   string
		format tar.Format
		ents   []entry
		want   []string // members' names
	}{
		{"ustar", tar.FormatUSTAR, []entry{{"a.jpg", tar.TypeReg, "AAA"}, {"dir/", tar.TypeDir, ""}, {"a.cls", tar.TypeReg, "1"}}, []string{"a.jpg", "a.cls"}},
		// USTAR splits a long name into prefix and name: libtar joins them.
		{"ustar prefix", tar.FormatUSTAR, []entry{{long, tar.TypeReg, "x"}}, []string{long}},
		{"gnu long name", tar.FormatGNU, []entry{{long, tar.TypeReg, "x"}, {"b.jpg", tar.TypeReg, ""}}, []string{long, "b.jpg"}},
		// PAX records are skipped: DALI reads the ustar name, where Go
		// leaves the name's ASCII bytes (Python: "?" for each other).
		{"pax", tar.FormatPAX, []entry{{"é.jpg", tar.TypeReg, "x"}}, []string{".jpg"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := mkTar(t, tc.format, tc.ents...)
			ms, err := ReadTar(bytes.NewReader(b), int64(len(b)), "s.tar")
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range ms {
				got = append(got, m.Name)
				if m.Offset%BlockSize != 0 {
					t.Errorf("%q: data at %d", m.Name, m.Offset)
				}
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("members %q, want %q", got, tc.want)
			}
			if tc.name == "ustar" && string(b[ms[0].Offset:ms[0].Offset+ms[0].Size])+string(b[ms[1].Offset:ms[1].Offset+ms[1].Size]) != "AAA1" {
				t.Errorf("data %+v", ms)
			}
		})
	}
}

func TestReadTarRefuses(t *testing.T) {
	reg := mkTar(t, tar.FormatUSTAR, entry{"a.jpg", tar.TypeReg, strings.Repeat("x", 1000)})
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(reg)
	zw.Close()
	badSum := bytes.Clone(reg)
	badSum[0] = 'b'
	sparse := bytes.Clone(reg)
	sparse[156] = 'S'
	fixSum(sparse)
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"gzip", gz.Bytes(), ErrCompressed},
		{"checksum", badSum, ErrCorruptTar},
		{"sparse", sparse, ErrSparse},
		{"symlink", mkTar(t, tar.FormatUSTAR, entry{"a.jpg", tar.TypeSymlink, ""}), ErrMemberType},
		{"hard link", mkTar(t, tar.FormatUSTAR, entry{"a.jpg", tar.TypeLink, ""}), ErrMemberType},
		{"fifo", mkTar(t, tar.FormatUSTAR, entry{"a.jpg", tar.TypeFifo, ""}), ErrMemberType},
		{"truncated data", reg[:1024], ErrTruncated},
		{"half a header", reg[:300], ErrCorruptTar},
		{"pax size", paxSize(t), ErrPAXSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadTar(bytes.NewReader(tc.b), int64(len(tc.b)), "shard-7.tar")
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), "shard-7.tar") {
				t.Fatalf("err %v, want %v naming the shard", err, tc.want)
			}
			if tc.name != "gzip" && tc.name != "half a header" && tc.name != "checksum" && !strings.Contains(err.Error(), "a.jpg") {
				t.Errorf("err %v does not name the member", err)
			}
		})
	}
}

// paxSize is a tar whose PAX header overrides a member's size.
func paxSize(t *testing.T) []byte {
	var out bytes.Buffer
	w := tar.NewWriter(&out)
	w.WriteHeader(&tar.Header{Name: "a.jpg", Size: 1, Format: tar.FormatPAX, PAXRecords: map[string]string{"size": "1"}})
	w.Write([]byte("x"))
	w.Close()
	return out.Bytes()
}

func fixSum(b []byte) {
	copy(b[148:156], "        ")
	var s int
	for _, c := range b[:512] {
		s += int(c)
	}
	copy(b[148:156], []byte(strings.Repeat("0", 6-len(itoa8(s)))+itoa8(s)+"\x00 "))
}

func itoa8(n int) string {
	var d []byte
	for n > 0 {
		d = append([]byte{byte('0' + n%8)}, d...)
		n /= 8
	}
	return string(d)
}

// TestEndBlocks: one block whose name starts with NUL is skipped, two end
// the archive (libtar's th_read), whatever follows.
func TestEndBlocks(t *testing.T) {
	a := mkTar(t, tar.FormatUSTAR, entry{"a.jpg", tar.TypeReg, "A"})
	b := mkTar(t, tar.FormatUSTAR, entry{"b.jpg", tar.TypeReg, "B"})
	hdrA := a[:1024] // header + data block
	one := append(append(bytes.Clone(hdrA), make([]byte, 512)...), b...)
	two := append(append(bytes.Clone(hdrA), make([]byte, 1024)...), b...)
	for _, tc := range []struct {
		name string
		b    []byte
		n    int
	}{{"one skipped", one, 2}, {"two end", two, 1}, {"no end blocks", hdrA, 1}, {"empty", nil, 0}} {
		ms, err := ReadTar(bytes.NewReader(tc.b), int64(len(tc.b)), "s")
		if err != nil || len(ms) != tc.n {
			t.Errorf("%s: %d members (%v), want %d", tc.name, len(ms), err, tc.n)
		}
	}
}

func TestGroupMembers(t *testing.T) {
	ms := func(names ...string) []Member {
		var out []Member
		for _, n := range names {
			out = append(out, Member{Name: n})
		}
		return out
	}
	for _, tc := range []struct {
		names []string
		want  string // key:count,...
	}{
		{nil, ":0"},
		{[]string{"a.jpg", "a.cls", "b.jpg"}, "a:2,b:1"},
		{[]string{".h.jpg", "a.jpg"}, ":0,a:1"}, // DALI's empty first sample
		{[]string{"a.jpg", "b.jpg", "a.cls"}, "a:1,b:1,a:1"},
		{[]string{"d/x.y.z", "d/x.q", "nodot"}, "d/x:2,nodot:1"},
		{[]string{"a.b/c.jpg"}, "a.b/c:1"},
	} {
		gs, _ := GroupMembers(ms(tc.names...))
		var got []string
		for _, g := range gs {
			got = append(got, g.Key+":"+string(rune('0'+g.Count)))
		}
		if strings.Join(got, ",") != tc.want {
			t.Errorf("%q: %s, want %s", tc.names, strings.Join(got, ","), tc.want)
		}
	}
}

// FuzzReadTar: any bytes give members inside the file on blocks, or an
// error; never a panic.
func FuzzReadTar(f *testing.F) {
	f.Add(mkTar(f, tar.FormatPAX, entry{"a.jpg", tar.TypeReg, "x"}, entry{strings.Repeat("l", 200) + ".cls", tar.TypeReg, "yy"}))
	f.Add(mkTar(f, tar.FormatGNU, entry{strings.Repeat("l", 200) + ".cls", tar.TypeReg, "yy"}))
	f.Add(mkTar(f, tar.FormatUSTAR, entry{"a", tar.TypeDir, ""}))
	f.Fuzz(func(t *testing.T, b []byte) {
		ms, err := ReadTar(bytes.NewReader(b), int64(len(b)), "f")
		if err != nil {
			return
		}
		for _, m := range ms {
			if m.Offset%BlockSize != 0 || m.Offset < 0 || m.Size < 0 || m.Offset+m.Size > int64(len(b)) {
				t.Fatalf("member %+v outside %d bytes", m, len(b))
			}
		}
	})
}
