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
// returns the kept samples and the first underfull one (-1: none).
func scanSelect(t *testing.T, m *Map, o Options) (kept []int, under int) {
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
	under = -1
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
		if used >= len(o.Ext) || o.Missing == MissingEmpty {
			kept = append(kept, i)
		} else if under < 0 {
			under = i
		}
	}
	return kept, under
}

// TestSelectAgainstAScan: over random maps (a sample of 0 to 4 members
// of six extensions, two differing in case, in any order) and random
// selections (alternatives, case, each missing behaviour), Select from
// the map's patterns keeps the samples a pass over every sample keeps,
// in order (Len, Index), and refuses an underfull sample naming the
// first.
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
			kept, under := scanSelect(t, m, o)
			v, err := m.Select(o)
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
		}
		m.Close()
	}
}
