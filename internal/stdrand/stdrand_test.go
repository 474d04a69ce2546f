// SPDX-License-Identifier: Apache-2.0

package stdrand

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

// refCase is one line of testdata/libstdcxx.txt: a name, its parameters,
// and after ":" the values libstdc++ gave.
type refCase struct {
	line         int
	name         string
	params, want []uint64
	next         *uint64 // the engine's output after the case's draws, when the line has one
}

func loadRef(t *testing.T) []refCase {
	t.Helper()
	f, err := os.Open("testdata/libstdcxx.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cases []refCase
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	nums := func(ln int, fields []string) []uint64 {
		var v []uint64
		for _, s := range fields {
			x, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				t.Fatalf("testdata line %d: %v", ln, err)
			}
			v = append(v, x)
		}
		return v
	}
	for ln := 1; sc.Scan(); ln++ {
		head, tail, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			t.Fatalf("testdata line %d has no ':'", ln)
		}
		hf := strings.Fields(head)
		tf := strings.Fields(tail)
		c := refCase{line: ln, name: hf[0], params: nums(ln, hf[1:])}
		if k := len(tf); k >= 2 && tf[k-2] == "next" {
			n := nums(ln, tf[k-1:])[0]
			c.next, tf = &n, tf[:k-2]
		}
		c.want = nums(ln, tf)
		cases = append(cases, c)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(cases) < 50 {
		t.Fatalf("testdata has %d cases", len(cases))
	}
	return cases
}

func equal(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestAgainstLibstdcxx checks every engine, seeding, distribution range
// and shuffle length of testdata/libstdcxx.txt (made by testdata/gen.cc
// with g++) against this package.
func TestAgainstLibstdcxx(t *testing.T) {
	seen := map[string]int{}
	for _, c := range loadRef(t) {
		seen[c.name]++
		var got []uint64
		var next uint64
		switch c.name {
		case "mt19937":
			g := NewMT19937(uint32(c.params[0]))
			for i := 1; i <= 10000; i++ {
				v := g.Next()
				if i <= 5 || i == 1000 || i == 10000 {
					got = append(got, v)
				}
			}
		case "seed_seq":
			in := make(SeedSeq, 0, len(c.params)-1)
			for _, v := range c.params[1:] {
				in = append(in, uint32(v))
			}
			out := make([]uint32, c.params[0])
			in.Generate(out)
			for _, v := range out {
				got = append(got, uint64(v))
			}
		case "minstd_rand0_seq":
			g := NewMinstdRand0Seq(SeedSeq{uint32(c.params[0])})
			for range 5 {
				got = append(got, g.Next())
			}
		case "uniform_minstd":
			g := NewMinstdRand0Seq(SeedSeq{42})
			got, next = draws(&g, c.params[0], c.params[1])
		case "uniform_mt19937":
			got, next = draws(NewMT19937(5489), c.params[0], c.params[1])
		case "uniform_mt19937_64":
			got, next = draws(NewMT64(5489), c.params[0], c.params[1])
		case "shuffle", "shuffle_mt19937_64":
			n := int(c.params[0])
			p := make([]uint32, n)
			for i := range p {
				p[i] = uint32(i)
			}
			var g Engine = NewMT19937(524287)
			if c.name == "shuffle_mt19937_64" {
				g = NewMT64(c.params[1])
			}
			Shuffle(p, g)
			h := uint64(1469598103934665603)
			for _, x := range p {
				h ^= uint64(x)
				h *= 1099511628211
			}
			got = append(got, h)
			for _, x := range p[:min(n, 8)] {
				got = append(got, uint64(x))
			}
			next = g.Next()
		default:
			t.Fatalf("testdata line %d: unknown case %q", c.line, c.name)
		}
		if !equal(got, c.want) {
			t.Errorf("line %d %s %v: got %v, libstdc++ %v", c.line, c.name, c.params, got, c.want)
		}
		if c.next != nil && next != *c.next {
			t.Errorf("line %d %s %v: the engine's next output is %d, libstdc++'s %d (a different number of draws)", c.line, c.name, c.params, next, *c.next)
		}
	}
	for _, name := range []string{"mt19937", "seed_seq", "minstd_rand0_seq", "uniform_minstd", "uniform_mt19937", "uniform_mt19937_64", "shuffle", "shuffle_mt19937_64"} {
		if seen[name] == 0 {
			t.Errorf("testdata has no %s case", name)
		}
	}
}

// draws returns 20 draws from [a, b], each with a fresh distribution as
// gen.cc makes them, and the engine's next output.
func draws(g Engine, a, b uint64) ([]uint64, uint64) {
	var v []uint64
	for range 20 {
		v = append(v, UniformInt(g, a, b))
	}
	return v, g.Next()
}

// TestMT19937Known checks the standard's own check value ([rand.predef]:
// the 10000th output of a default-constructed mt19937 is 4123659995) and
// a few first outputs, independently of the testdata.
func TestMT19937Known(t *testing.T) {
	for _, tt := range []struct {
		seed  uint32
		nth   int
		value uint32
	}{
		{5489, 1, 3499211612},
		{5489, 2, 581869302},
		{5489, 10000, 4123659995},
	} {
		g := NewMT19937(tt.seed)
		var v uint32
		for range tt.nth {
			v = g.Uint32()
		}
		if v != tt.value {
			t.Errorf("mt19937(%d) output %d = %d, want %d", tt.seed, tt.nth, v, tt.value)
		}
	}
	// [rand.predef]: the 10000th output of a default-constructed
	// minstd_rand0 (seed 1) is 1043618065.
	g := NewMinstdRand0(1)
	var v uint64
	for range 10000 {
		v = g.Next()
	}
	if v != 1043618065 {
		t.Errorf("minstd_rand0's 10000th output is %d, want 1043618065", v)
	}
	if z := NewMinstdRand0(0); z.x != 1 {
		t.Errorf("minstd_rand0(0) starts at %d, want 1 (a zero state would stick)", z.x)
	}
}

func TestUniformIntInRange(t *testing.T) {
	g := NewMinstdRand0(7)
	for _, r := range [][2]uint64{{0, 0}, {3, 3}, {0, 1}, {10, 20}, {0, 1 << 33}} {
		for range 1000 {
			if v := UniformInt(&g, r[0], r[1]); v < r[0] || v > r[1] {
				t.Fatalf("UniformInt(%d, %d) = %d", r[0], r[1], v)
			}
		}
	}
}

func TestShuffleIsPermutation(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 64, 65535, 65536, 70001} {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32(i)
		}
		Shuffle(p, NewMT19937(uint32(n)))
		seen := make([]bool, n)
		for _, v := range p {
			if seen[v] {
				t.Fatalf("n=%d: %d twice", n, v)
			}
			seen[v] = true
		}
	}
}

func BenchmarkMinstdUniform1024(b *testing.B) {
	g := NewMinstdRand0(1)
	for b.Loop() {
		UniformInt(&g, 0, 1023)
	}
}
