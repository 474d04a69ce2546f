// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"regexp"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap/npy"
)

// TestFingerprint: what names the dataset changes the fingerprint, what
// differs between two nodes' copies of it does not, and it survives the
// map's formats.
func TestFingerprint(t *testing.T) {
	base := synthMap(200, 1)
	want := base.Fingerprint()
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(want) {
		t.Fatalf("fingerprint %q is not %d lowercase hex digits", want, FingerprintLen)
	}
	clone := func() *Map {
		m := *base
		m.Classes = append([]string(nil), base.Classes...)
		m.Samples = append([]Sample(nil), base.Samples...)
		return &m
	}
	for _, tc := range []struct {
		name string
		edit func(m *Map)
		same bool
	}{
		// Another node's copy: other root, device, extents, inodes, times.
		{"another root and device", func(m *Map) { m.Root = "/mnt/other"; m.Device.Path = "/dev/sdb1"; m.Device.FSUUID = "x" }, true},
		{"other extents, inode and times", func(m *Map) {
			m.Samples[3].Extents = nil
			m.Samples[3].Reason = NoExtents
			m.Samples[3].Inode++
			m.Samples[3].MtimeNs++
			m.Samples[3].CtimeNs++
		}, true},
		// Another dataset.
		{"a sample less", func(m *Map) { m.Samples = m.Samples[:len(m.Samples)-1] }, false},
		{"two samples swapped", func(m *Map) { m.Samples[0], m.Samples[1] = m.Samples[1], m.Samples[0] }, false},
		{"a sample renamed", func(m *Map) { m.Samples[5].Path += "x" }, false},
		{"a sample's size", func(m *Map) { m.Samples[7].Size++ }, false},
		{"a label", func(m *Map) { m.Samples[9].Label++ }, false},
		{"a class renamed", func(m *Map) { m.Classes[0] = "renamed" }, false},
		{"a class added", func(m *Map) { m.Classes = append(m.Classes, "empty") }, false},
		// Lengths prefix every string: moving a byte from one name to the
		// next is another list.
		{"a byte moved between paths", func(m *Map) {
			m.Samples[0].Path += m.Samples[1].Path[:1]
			m.Samples[1].Path = m.Samples[1].Path[1:]
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := clone()
			tc.edit(m)
			if got := m.Fingerprint(); (got == want) != tc.same {
				t.Errorf("fingerprint %s, base %s: want same=%v", got, want, tc.same)
			}
		})
	}
	for _, f := range []Format{FormatBinary, FormatJSON} {
		m, err := Decode(encode(t, base, f))
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Fingerprint(); got != want {
			t.Errorf("format %s: fingerprint %s after a round trip, want %s", f, got, want)
		}
	}
	if got := synthMap(200, 1).Fingerprint(); got != want {
		t.Errorf("the same map made again: %s, want %s", got, want)
	}
}

// TestFingerprintV2: a numpy or listed map's fingerprint also names its
// reader, listing and each tensor's offset, type and shape; a folder
// layout's is the one main's version 1 code gave (pinned here).
func TestFingerprintV2(t *testing.T) {
	if got := v1Map().Fingerprint(); got != "064b6d401dd85c5bc37e3f85bab8f0d4" {
		t.Errorf("version 1 map: fingerprint %s, version 1 gave 064b6d401dd85c5bc37e3f85bab8f0d4", got)
	}
	base := synthTensorMap(50, 2)
	want := base.Fingerprint()
	for _, tc := range []struct {
		name string
		edit func(m *Map)
	}{
		{"listed", func(m *Map) { m.Listed = true }},
		{"a dtype", func(m *Map) {
			t := *m.Samples[4].Tensor
			t.DType ^= 3
			m.Samples[4].Tensor = &t
		}},
		{"a shape", func(m *Map) { m.Samples[6].Tensor = &Tensor{DType: npy.Uint8, Shape: []int64{m.Samples[6].Size}} }},
		{"an offset", func(m *Map) { m.Samples[8].Offset += 64 }},
	} {
		m := *base
		m.Samples = append([]Sample(nil), base.Samples...)
		tc.edit(&m)
		if m.Fingerprint() == want {
			t.Errorf("%s: fingerprint unchanged", tc.name)
		}
	}
	// Pinned from the code before fingerprints were hashed in buffers:
	// the same maps keep their fingerprints.
	for _, g := range []struct {
		name string
		m    *Map
		want string
	}{
		{"folder layout", synthMap(200, 1), "ad4930f83102e7b062df7428635c5f67"},
		{"tensors", base, "7f0df9f5ee5e8474086534ab3c38c2ad"},
		{"listed", synthListedMap(9), "7717e0d56eb96889928a13ad7df00026"},
	} {
		if got := g.m.Fingerprint(); got != g.want {
			t.Errorf("%s map: fingerprint %s, before %s", g.name, got, g.want)
		}
	}
	if m := synthListedMap(9); m.Fingerprint() == func() string { m.Listed = false; return m.Fingerprint() }() {
		t.Error("listed and unlisted maps share a fingerprint")
	}
}

// TestFingerprinterStream: the buffered hash is the hash of the bytes
// appended, whatever their lengths against the buffer's.
func TestFingerprinterStream(t *testing.T) {
	for _, tc := range []struct {
		name    string
		strings []int // lengths
	}{
		{"none", nil},
		{"small", []int{0, 1, 7, 30}},
		{"to the buffer's end", []int{fingerprintBuf - 8}},
		{"across the buffer", []int{fingerprintBuf - 11, 20, 3}},
		{"longer than the buffer", []int{3*fingerprintBuf + 5, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := fingerprinter{h: sha256.New(), buf: make([]byte, 0, fingerprintBuf)}
			var want []byte
			for i, n := range tc.strings {
				s := strings.Repeat(string(rune('a'+i)), n)
				f.string(s)
				f.uint(uint64(i))
				want = binary.LittleEndian.AppendUint64(want, uint64(n))
				want = append(want, s...)
				want = binary.LittleEndian.AppendUint64(want, uint64(i))
			}
			if got, sum := f.sum(), sha256.Sum256(want); !bytes.Equal(got, sum[:]) {
				t.Errorf("hash %x, want %x", got, sum)
			}
		})
	}
}
