// SPDX-License-Identifier: Apache-2.0

// Package stdrand reproduces, bit for bit, the parts of libstdc++ (GCC 11 on) that DALI draws from.
// Those are std::mt19937, std::mt19937_64, std::minstd_rand0, std::seed_seq,
// std::uniform_int_distribution and std::shuffle.
//
// Where the standard leaves the algorithm to the library, libstdc++'s is used:
//
//   - uniform_int_distribution computes in uint64. A 32- or 64-bit engine uses Lemire's method.
//     Another larger engine rejects draws past the last whole bucket; a smaller one combines draws.
//   - std::shuffle is Fisher-Yates from the front. When the engine's range is at least n²,
//     one draw gives the swap positions of two consecutive elements.
//
// testdata/gen.cc prints reference values from the real library; the tests compare against them.
package stdrand

//go:generate sh -c "g++ -std=c++17 -O2 -o /tmp/stdrand-gen testdata/gen.cc && /tmp/stdrand-gen > testdata/libstdcxx.txt && rm -f /tmp/stdrand-gen"

import "math/bits"

// Engine is a uniform random bit generator: Next returns values in
// [Min(), Max()], as <random>'s engines do.
type Engine interface {
	Next() uint64
	Min() uint64
	Max() uint64
}

// UniformInt returns what std::uniform_int_distribution returns for [a, b], a <= b.
// It consumes the same engine outputs; signed ranges map by two's complement.
func UniformInt(g Engine, a, b uint64) uint64 {
	return a + scaled(g, b-a)
}

// scaled draws from [0, urange] (urange = b - a).
func scaled(g Engine, urange uint64) uint64 {
	gmin := g.Min()
	grange := g.Max() - gmin
	switch {
	case grange > urange: // downscaling
		uerange := urange + 1 // urange may be 0
		switch grange {
		case 1<<64 - 1: // exactly 64 bits: Lemire with a 128-bit product
			hi, lo := bits.Mul64(g.Next(), uerange)
			if lo < uerange {
				thresh := -uerange % uerange
				for lo < thresh {
					hi, lo = bits.Mul64(g.Next(), uerange)
				}
			}
			return hi
		case 1<<32 - 1: // exactly 32 bits: Lemire with a 64-bit product
			r := uint32(uerange)
			p := g.Next() * uint64(r)
			if lo := uint32(p); lo < r {
				thresh := -r % r
				for lo < thresh {
					p = g.Next() * uint64(r)
					lo = uint32(p)
				}
			}
			return p >> 32
		}
		scaling := grange / uerange
		past := uerange * scaling
		for {
			ret := g.Next() - gmin
			if ret < past {
				return ret / scaling
			}
		}
	case grange < urange: // upscaling: (grange+1)·high + low, high drawn recursively
		uerngrange := grange + 1
		for {
			tmp := uerngrange * scaled(g, urange/uerngrange)
			ret := tmp + (g.Next() - gmin)
			if ret <= urange && ret >= tmp {
				return ret
			}
		}
	}
	return g.Next() - gmin
}

// Shuffle permutes p as std::shuffle(p.begin(), p.end(), g) does, drawing
// the same engine outputs.
func Shuffle[T any](p []T, g Engine) {
	n := uint64(len(p))
	if n == 0 {
		return
	}
	if grange := g.Max() - g.Min(); grange/n >= n {
		// Two swap positions from one draw: i's in [0, i] and i+1's in
		// [0, i+1]. An even length leaves an odd count of swaps: the
		// first is drawn alone.
		i := uint64(1)
		if n%2 == 0 {
			j := UniformInt(g, 0, 1)
			p[i], p[j] = p[j], p[i]
			i++
		}
		for i < n {
			r := i + 1 // positions [0, i]
			x := UniformInt(g, 0, r*(r+1)-1)
			j, k := x/(r+1), x%(r+1)
			p[i], p[j] = p[j], p[i]
			p[i+1], p[k] = p[k], p[i+1]
			i += 2
		}
		return
	}
	for i := uint64(1); i < n; i++ {
		j := UniformInt(g, 0, i)
		p[i], p[j] = p[j], p[i]
	}
}
