// SPDX-License-Identifier: Apache-2.0

package permute

import (
	"fmt"
	"math"
	"testing"
)

// TestBijection: every N from 0 to 600 and a few larger, several seeds
// and epochs: At is a permutation of [0, N) and Index its inverse.
func TestBijection(t *testing.T) {
	ns := []uint64{}
	for n := range uint64(600) {
		ns = append(ns, n)
	}
	ns = append(ns, 1<<16, 1<<16+1, 99_991, 1<<20-1)
	for _, n := range ns {
		for _, se := range [][2]uint64{{0, 0}, {1, 0}, {1, 1}, {1 << 40, 7}} {
			p := New(n, se[0], se[1])
			seen := make([]bool, n)
			for i := range n {
				v := p.At(i)
				if v >= n || seen[v] {
					t.Fatalf("N=%d seed,epoch=%v: At(%d)=%d repeated or out of range", n, se, i, v)
				}
				seen[v] = true
				if p.Index(v) != i {
					t.Fatalf("N=%d: Index(At(%d)) = %d", n, i, p.Index(v))
				}
			}
		}
	}
}

// TestResumeAndEpochs: a permutation is a function of (N, seed, epoch)
// alone (resuming at a position is computing At there), and epochs and
// seeds differ.
func TestResumeAndEpochs(t *testing.T) {
	const n = 1_000_003
	a, b := New(n, 5, 3), New(n, 5, 3)
	for _, i := range []uint64{0, 1, 77, n / 2, n - 1} {
		if a.At(i) != b.At(i) {
			t.Fatalf("At(%d) differs between equal permutations", i)
		}
	}
	same := func(p, q Perm) int {
		k := 0
		for i := range uint64(10_000) {
			if p.At(i) == q.At(i) {
				k++
			}
		}
		return k
	}
	if k := same(New(n, 5, 3), New(n, 5, 4)); k > 5 {
		t.Errorf("epochs 3 and 4 agree at %d of 10000 positions", k)
	}
	if k := same(New(n, 5, 3), New(n, 6, 3)); k > 5 {
		t.Errorf("seeds 5 and 6 agree at %d of 10000 positions", k)
	}
}

// chi2Bound is a loose upper bound of chi-square with dof degrees of
// freedom at p ≈ 1e-4 (Wilson–Hilferty).
func chi2Bound(dof float64) float64 {
	const z = 3.72
	a := 2 / (9 * dof)
	return dof * math.Pow(1-a+z*math.Sqrt(a), 3)
}

// TestUniformPositions: over many (seed, epoch) pairs, each value lands
// at each position equally often (chi-square), for N below, at and
// above a power of 4 (where cycle walking matters most).
func TestUniformPositions(t *testing.T) {
	for _, n := range []uint64{5, 16, 17, 100} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			trials := uint64(400) * n
			counts := make([]float64, n*n)
			for s := range trials {
				p := New(n, s, s%3)
				for i := range n {
					counts[i*n+p.At(i)]++
				}
			}
			exp := float64(trials) / float64(n)
			var chi float64
			for _, c := range counts {
				chi += (c - exp) * (c - exp) / exp
			}
			if dof := float64((n - 1) * (n - 1)); chi > chi2Bound(dof) {
				t.Errorf("chi-square %.1f over %v dof: positions not uniform", chi, dof)
			}
		})
	}
}

// TestUniformPermutations: for N=5, all 120 permutations come out
// equally often over 240 000 seeds (chi-square, 119 dof).
func TestUniformPermutations(t *testing.T) {
	const n, trials = 5, 240_000
	counts := map[[n]uint64]float64{}
	for s := range uint64(trials) {
		p := New(n, s, 0)
		var k [n]uint64
		for i := range uint64(n) {
			k[i] = p.At(i)
		}
		counts[k]++
	}
	if len(counts) != 120 {
		t.Fatalf("%d distinct permutations of 5, want 120", len(counts))
	}
	exp := float64(trials) / 120
	var chi float64
	for _, c := range counts {
		chi += (c - exp) * (c - exp) / exp
	}
	if chi > chi2Bound(119) {
		t.Errorf("chi-square %.1f over 119 dof: permutations not uniform", chi)
	}
}

// TestAdjacentPairs: positions i and i+1 hold a pair (a, b) as often as
// a uniform permutation's (each ordered pair of distinct values 1/(N(N-1))).
func TestAdjacentPairs(t *testing.T) {
	const n = 12
	counts := make([]float64, n*n)
	trials := 200_000
	for s := range uint64(trials) {
		p := New(n, s, 1)
		counts[p.At(3)*n+p.At(4)]++
	}
	exp := float64(trials) / (n * (n - 1))
	var chi float64
	for a := range n {
		for b := range n {
			if a == b {
				if counts[a*n+b] != 0 {
					t.Fatalf("value repeated")
				}
				continue
			}
			c := counts[a*n+b]
			chi += (c - exp) * (c - exp) / exp
		}
	}
	if dof := float64(n*(n-1) - 1); chi > chi2Bound(dof) {
		t.Errorf("chi-square %.1f over %v dof: adjacent pairs not uniform", chi, dof)
	}
}

func BenchmarkAt(b *testing.B) {
	p := New(100_000_000, 1, 2)
	var s uint64
	for i := range b.N {
		s += p.At(uint64(i) % 100_000_000)
	}
	_ = s
}
