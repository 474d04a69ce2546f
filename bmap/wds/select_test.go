// SPDX-License-Identifier: Apache-2.0

package wds

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// scanSelect is Select as a pass over every sample: each component's
// extension against each output's alternatives, in tar order, a sample
// kept when as many components fill an output as there are outputs. It
// returns the kept samples, the first underfull one (-1: none), per
// output how many of the other samples lack it, and whether any
// component of any sample fills each output.
func scanSelect(t *testing.T, m *Map, o Options) (kept []int, under int, lacking []int, hit []bool) {
	t.Helper()
	fills := func(e string, out int) bool {
		alts := strings.Split(o.Ext[out], ";")
		if alts[len(alts)-1] == "" {
			alts = alts[:len(alts)-1]
		}
		for _, a := range alts {
			if a == e || (!o.CaseSensitive && strings.EqualFold(a, e)) {
				return true
			}
		}
		return false
	}
	under, lacking, hit = -1, make([]int, len(o.Ext)), make([]bool, len(o.Ext))
	for i := range m.Len() {
		s, err := m.Sample(i)
		if err != nil {
			t.Fatal(err)
		}
		filled := make([]bool, len(o.Ext))
		used := 0
		for j := s.First; j < s.First+s.Count; j++ {
			c, _ := m.Component(s, j)
			fill := false
			for out := range o.Ext {
				if !filled[out] && fills(m.Exts()[c.Ext], out) {
					filled[out], fill = true, true
				}
			}
			if fill {
				used++
			}
		}
		for out, f := range filled {
			hit[out] = hit[out] || f
		}
		if used >= len(o.Ext) || o.Missing == MissingEmpty {
			kept = append(kept, i)
			continue
		}
		if under < 0 {
			under = i
		}
		for out, f := range filled {
			if !f {
				lacking[out]++
			}
		}
	}
	return kept, under, lacking, hit
}

// TestSelectAgainstAScan: over random maps (a sample of 0 to 4 members
// of six extensions, two differing in case, in any order) and random
// selections (alternatives, case, each missing behaviour), Select from
// the map's patterns keeps the samples a pass over every sample keeps,
// in order (Len, Index), counts those skip leaves out and why
// (Skipped), refuses an underfull sample naming the first, and refuses
// an ext entry no component fills, naming the map's extensions.
func TestSelectAgainstAScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	vocab := []string{"jpg", "JPG", "cls", "txt", "png", "json"}
	for round := range 20 {
		p := filepath.Join(t.TempDir(), "m.bmap")
		w, err := NewWriter(p)
		if err != nil {
			t.Fatal(err)
		}
		n := 1 + rng.IntN(3000)
		var off int64
		for i := range n {
			var names []string
			var offs, sizes []int64
			for range rng.IntN(5) {
				names = append(names, "k."+vocab[rng.IntN(len(vocab))])
				offs, sizes = append(offs, off), append(sizes, 1+rng.Int64N(9000))
				off += 10240
			}
			if err := w.Sample(fmt.Sprint(i), names, offs, sizes); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(shardsMap(1, off+1024)); err != nil {
			t.Fatal(err)
		}
		m, err := Open(p)
		if err != nil {
			t.Fatal(err)
		}
		for range 30 {
			var o Options
			for range 1 + rng.IntN(3) {
				e := vocab[rng.IntN(len(vocab))]
				if rng.IntN(3) == 0 {
					e += ";" + vocab[rng.IntN(len(vocab))]
				}
				if rng.IntN(5) == 0 {
					e += ";"
				}
				o.Ext = append(o.Ext, e)
			}
			o.CaseSensitive, o.Missing = rng.IntN(2) == 0, Missing(rng.IntN(3))
			kept, under, lacking, hit := scanSelect(t, m, o)
			v, err := m.Select(o)
			if i := slices.Index(hit, false); i >= 0 {
				if !errors.Is(err, ErrNoMatch) || !strings.Contains(err.Error(), fmt.Sprintf("ext[%d] %q", i, o.Ext[i])) {
					t.Fatalf("round %d, %+v: %v, want ext[%d] refused", round, o, err, i)
				}
				continue
			}
			if o.Missing == MissingError && under >= 0 {
				s, _ := m.Sample(under)
				if !errors.Is(err, ErrUnderfull) || !strings.Contains(err.Error(), fmt.Sprintf("sample %q", s.Key)) {
					t.Fatalf("round %d, %+v: %v, want underfull sample %q", round, o, err, s.Key)
				}
				continue
			}
			if err != nil {
				t.Fatalf("round %d, %+v: %v", round, o, err)
			}
			got := make([]int, v.Len())
			for i := range got {
				got[i] = v.Index(i)
			}
			if !slices.Equal(got, kept) {
				t.Fatalf("round %d, %+v: %d samples kept, want %d", round, o, len(got), len(kept))
			}
			skipped, why := v.Skipped()
			if o.Missing != MissingSkip {
				lacking = make([]int, len(o.Ext))
			}
			if skipped != m.Len()-len(kept) || !slices.Equal(why, lacking) {
				t.Fatalf("round %d, %+v: skipped %d %v, want %d %v", round, o, skipped, why, m.Len()-len(kept), lacking)
			}
		}
		m.Close()
	}
}

// TestSelectRefusesAnUnmatchedExt: an ext entry no member fills (an
// extension the tars lack, or named with its dot) is refused, with the
// tars' extensions and the dot named.
func TestSelectRefusesAnUnmatchedExt(t *testing.T) {
	p := filepath.Join(t.TempDir(), "m.bmap")
	w, err := NewWriter(p)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if err := w.Sample(fmt.Sprint(i), []string{"k.JPEG", "k.cls"}, []int64{int64(i) * 2048, int64(i)*2048 + 1024}, []int64{10, 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(shardsMap(1, 8192)); err != nil {
		t.Fatal(err)
	}
	m, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, c := range []struct {
		o    Options
		want []string
	}{
		{Options{Ext: []string{"png", "cls"}, CaseSensitive: true}, []string{`ext[0] "png"`, `"JPEG", "cls"`, "case-sensitively"}},
		{Options{Ext: []string{"jpeg", "cls"}, CaseSensitive: true, Missing: MissingSkip}, []string{`ext[0] "jpeg"`, `"JPEG"`}},
		{Options{Ext: []string{"jpeg", ".cls"}}, []string{`ext[1] ".cls"`, "case-insensitively", `without its dot ("cls", not ".cls")`}},
	} {
		if _, err := m.Select(c.o); !errors.Is(err, ErrNoMatch) {
			t.Fatalf("%+v: %v, want ErrNoMatch", c.o, err)
		} else {
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%+v: %q lacks %q", c.o, err, w)
				}
			}
		}
	}
	if v, err := m.Select(Options{Ext: []string{"jpeg", "cls"}}); err != nil || v.Len() != 4 {
		t.Fatalf("case-insensitive jpeg: %v", err)
	}
}
