// SPDX-License-Identifier: Apache-2.0

package stdrand

// MT19937 is std::mt19937: the 32-bit Mersenne Twister with the
// standard's parameters.
type MT19937 struct {
	mt [624]uint32
	i  int
}

// NewMT19937 returns std::mt19937(seed).
func NewMT19937(seed uint32) *MT19937 {
	m := &MT19937{}
	m.Seed(seed)
	return m
}

// Seed re-seeds m as std::mt19937::seed(seed) does.
func (m *MT19937) Seed(seed uint32) {
	m.mt[0] = seed
	for i := 1; i < len(m.mt); i++ {
		prev := m.mt[i-1]
		m.mt[i] = 1812433253*(prev^prev>>30) + uint32(i)
	}
	m.i = len(m.mt)
}

// Uint32 returns the next output.
func (m *MT19937) Uint32() uint32 {
	const n, mid = 624, 397
	const upper, lower = 0x80000000, 0x7fffffff
	if m.i >= n {
		for k := 0; k < n; k++ {
			y := m.mt[k]&upper | m.mt[(k+1)%n]&lower
			v := m.mt[(k+mid)%n] ^ y>>1
			if y&1 != 0 {
				v ^= 0x9908b0df
			}
			m.mt[k] = v
		}
		m.i = 0
	}
	y := m.mt[m.i]
	m.i++
	y ^= y >> 11
	y ^= y << 7 & 0x9d2c5680
	y ^= y << 15 & 0xefc60000
	y ^= y >> 18
	return y
}

// Next returns the next output (Engine).
func (m *MT19937) Next() uint64 { return uint64(m.Uint32()) }

// Min returns 0, the smallest output (Engine).
func (m *MT19937) Min() uint64 { return 0 }

// Max returns 2^32-1, the largest output (Engine).
func (m *MT19937) Max() uint64 { return 1<<32 - 1 }

// MT64 is std::mt19937_64: the 64-bit Mersenne Twister with the
// standard's parameters.
type MT64 struct {
	mt [312]uint64
	i  int
}

// NewMT64 returns std::mt19937_64(seed).
func NewMT64(seed uint64) *MT64 {
	m := &MT64{i: 312}
	m.mt[0] = seed
	for i := 1; i < len(m.mt); i++ {
		prev := m.mt[i-1]
		m.mt[i] = 6364136223846793005*(prev^prev>>62) + uint64(i)
	}
	return m
}

// Next returns the next output (Engine).
func (m *MT64) Next() uint64 {
	const n, mid = 312, 156
	const upper, lower = 0xFFFFFFFF80000000, 0x7FFFFFFF
	if m.i >= n {
		for k := 0; k < n; k++ {
			y := m.mt[k]&upper | m.mt[(k+1)%n]&lower
			v := m.mt[(k+mid)%n] ^ y>>1
			if y&1 != 0 {
				v ^= 0xB5026F5AA96619E9
			}
			m.mt[k] = v
		}
		m.i = 0
	}
	y := m.mt[m.i]
	m.i++
	y ^= y >> 29 & 0x5555555555555555
	y ^= y << 17 & 0x71D67FFFEDA60000
	y ^= y << 37 & 0xFFF7EEE000000000
	y ^= y >> 43
	return y
}

// Min returns 0, the smallest output (Engine).
func (m *MT64) Min() uint64 { return 0 }

// Max returns 2^64-1, the largest output (Engine).
func (m *MT64) Max() uint64 { return 1<<64 - 1 }

// minstdM is minstd_rand0's modulus, 2^31-1.
const minstdM = 1<<31 - 1

// MinstdRand0 is std::minstd_rand0, which libstdc++ makes
// std::default_random_engine: x ← 16807·x mod (2^31-1), output x. Its
// zero value is not seeded: use NewMinstdRand0 or NewMinstdRand0Seq. It
// is a plain value: a copy is a snapshot of its state.
type MinstdRand0 struct{ x uint64 }

// NewMinstdRand0 returns std::minstd_rand0(s).
func NewMinstdRand0(s uint64) MinstdRand0 {
	if s%minstdM == 0 {
		return MinstdRand0{1}
	}
	return MinstdRand0{s % minstdM}
}

// NewMinstdRand0Seq returns std::minstd_rand0(q) for a seed sequence q:
// the engine takes the fourth of four 32-bit words q generates.
func NewMinstdRand0Seq(q SeedSeq) MinstdRand0 {
	var w [4]uint32
	q.Generate(w[:])
	return NewMinstdRand0(uint64(w[3]))
}

// Next returns the next output, in [1, 2^31-2] (Engine).
func (m *MinstdRand0) Next() uint64 {
	m.x = m.x * 16807 % minstdM
	return m.x
}

// Min returns 1, the smallest output (Engine).
func (m *MinstdRand0) Min() uint64 { return 1 }

// Max returns 2^31-2, the largest output (Engine).
func (m *MinstdRand0) Max() uint64 { return minstdM - 1 }

// SeedSeq is std::seed_seq: the 32-bit words it was made from.
type SeedSeq []uint32

// Generate fills dst as std::seed_seq::generate does ([rand.util.seedseq]).
func (s SeedSeq) Generate(dst []uint32) {
	n := len(dst)
	if n == 0 {
		return
	}
	for i := range dst {
		dst[i] = 0x8b8b8b8b
	}
	var t int
	switch {
	case n >= 623:
		t = 11
	case n >= 68:
		t = 7
	case n >= 39:
		t = 5
	case n >= 7:
		t = 3
	default:
		t = (n - 1) / 2
	}
	p := (n - t) / 2
	q := p + t
	m := max(len(s)+1, n)
	tf := func(x uint32) uint32 { return x ^ x>>27 }
	for k := 0; k < m; k++ {
		r1 := 1664525 * tf(dst[k%n]^dst[(k+p)%n]^dst[(k+n-1)%n])
		var r2 uint32
		switch {
		case k == 0:
			r2 = r1 + uint32(len(s))
		case k <= len(s):
			r2 = r1 + uint32(k%n) + s[k-1]
		default:
			r2 = r1 + uint32(k%n)
		}
		dst[(k+p)%n] += r1
		dst[(k+q)%n] += r2
		dst[k%n] = r2
	}
	for k := m; k < m+n; k++ {
		r3 := 1566083941 * tf(dst[k%n]+dst[(k+p)%n]+dst[(k+n-1)%n])
		r4 := r3 - uint32(k%n)
		dst[(k+p)%n] ^= r3
		dst[(k+q)%n] ^= r4
		dst[k%n] = r4
	}
}
