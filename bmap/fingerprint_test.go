// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"regexp"
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
	if m := synthListedMap(9); m.Fingerprint() == func() string { m.Listed = false; return m.Fingerprint() }() {
		t.Error("listed and unlisted maps share a fingerprint")
	}
}
