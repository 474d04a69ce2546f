// SPDX-License-Identifier: Apache-2.0

// Package permute computes a pseudo-random permutation of [0, N) without storing it.
// At(i) costs O(1) time and memory, and the position is the whole state for resuming.
//
// Two stages: a balanced Feistel network over the smallest 4^h ≥ N, cycle-walked into [0, N),
// then an affine map x → a·x + b mod N. Keys come from the seed and the epoch.
// To every test here the result is indistinguishable from uniform. N must be below 2^62.
// It is not cryptographic.
package permute

import "math/bits"

// Rounds is the number of Feistel rounds.
const Rounds = 8

// Perm is one epoch's permutation of [0, N). The zero value is the
// empty permutation. Safe for concurrent use (it is a value).
type Perm struct {
	n    uint64
	half uint   // bits per half
	mask uint64 // (1 << half) - 1
	keys [2][Rounds]uint64
	mul  [2]uint64 // affine steps x -> mul·x + add mod n, mul coprime with n
	add  [2]uint64
	inv  [2]uint64 // mul's inverses mod n
}

// New returns the permutation of [0, n) for seed and epoch: every
// (seed, epoch) pair gives its own.
func New(n, seed, epoch uint64) Perm {
	p := Perm{n: n}
	if n <= 1 {
		return p
	}
	b := uint(bits.Len64(n - 1)) // bits for n-1
	p.half = (b + 1) / 2
	if p.half == 0 {
		p.half = 1
	}
	p.mask = 1<<p.half - 1
	s := mix(seed ^ 0x9e3779b97f4a7c15)
	s = mix(s ^ epoch*0xbf58476d1ce4e5b9)
	next := func() uint64 { s += 0x9e3779b97f4a7c15; return mix(s) }
	for j := range p.keys {
		for i := range p.keys[j] {
			p.keys[j][i] = next()
		}
		m := next()%(n-1) + 1
		for gcd(m, n) != 1 {
			m = m%(n-1) + 1
		}
		p.mul[j], p.add[j], p.inv[j] = m, next()%n, inverse(m, n)
	}
	return p
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// inverse returns m's inverse modulo n (m coprime with n).
func inverse(m, n uint64) uint64 {
	// Extended Euclid on signed 128-bit-safe values: n < 2^63 here.
	var t, nt int64 = 0, 1
	r, nr := int64(n), int64(m)
	for nr != 0 {
		q := r / nr
		t, nt = nt, t-q*nt
		r, nr = nr, r-q*nr
	}
	if t < 0 {
		t += int64(n)
	}
	return uint64(t)
}

// mulAdd returns (a·x + b) mod n.
func mulAdd(a, x, b, n uint64) uint64 {
	hi, lo := bits.Mul64(a, x)
	r := bits.Rem64(hi, lo, n)
	r, c := bits.Add64(r, b, 0)
	if c != 0 || r >= n {
		r -= n
	}
	return r
}

// At returns the value at position i in [0, N): two stages, each a
// cycle-walked Feistel network then an affine map modulo N (a Feistel
// network on halves of two bits or more is an even permutation of its
// domain; the affine maps give the odd ones their share).
func (p Perm) At(i uint64) uint64 {
	if p.n <= 1 {
		return i
	}
	x := i
	for j := range p.keys {
		x = p.walk(x, j, p.encrypt)
		x = mulAdd(p.mul[j], x, 0, p.n)
		x, _ = bits.Add64(x, p.add[j], 0)
		if x >= p.n {
			x -= p.n
		}
	}
	return x
}

// Index returns the position of value v: the inverse of At.
func (p Perm) Index(v uint64) uint64 {
	if p.n <= 1 {
		return v
	}
	x := v
	for j := len(p.keys) - 1; j >= 0; j-- {
		x = mulAdd(p.inv[j], x+p.n-p.add[j], 0, p.n) // x < n and add < n: no overflow below 2^63
		x = p.walk(x, j, p.decrypt)
	}
	return x
}

// walk applies f until the value falls in [0, N).
func (p Perm) walk(x uint64, j int, f func(uint64, int) uint64) uint64 {
	for {
		x = f(x, j)
		if x < p.n {
			return x
		}
	}
}

func (p Perm) encrypt(x uint64, j int) uint64 {
	l, r := x>>p.half, x&p.mask
	for _, k := range p.keys[j] {
		l, r = r, l^(mix(r^k)&p.mask)
	}
	return l<<p.half | r
}

func (p Perm) decrypt(x uint64, j int) uint64 {
	l, r := x>>p.half, x&p.mask
	for i := Rounds - 1; i >= 0; i-- {
		l, r = r^(mix(l^p.keys[j][i])&p.mask), l
	}
	return l<<p.half | r
}

// mix is splitmix64's finalizer: a bijective 64-bit mixer.
func mix(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}
