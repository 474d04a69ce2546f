// SPDX-License-Identifier: Apache-2.0
//
// Prints reference outputs of libstdc++'s <random> and std::shuffle for
// package stdrand's tests, one case a line: a name, its parameters, ":",
// the values. Run by `go generate` (see stdrand.go):
//
//	g++ -std=c++17 -O2 -o gen testdata/gen.cc && ./gen > testdata/libstdcxx.txt
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

static void mt(uint32_t seed) {
  std::mt19937 g(seed);
  std::printf("mt19937 %u :", seed);
  for (int i = 1; i <= 10000; i++) {
    uint32_t v = g();
    if (i <= 5 || i == 1000 || i == 10000) std::printf(" %u", v);
  }
  std::printf("\n");
}

static void seedseq(std::vector<uint32_t> in, size_t n) {
  std::seed_seq q(in.begin(), in.end());
  std::vector<uint32_t> out(n);
  q.generate(out.begin(), out.end());
  std::printf("seed_seq %zu", n);
  for (uint32_t v : in) std::printf(" %u", v);
  std::printf(" :");
  for (uint32_t v : out) std::printf(" %u", v);
  std::printf("\n");
}

static void minstd(uint64_t seed) {  // as DALI seeds it: through a seed_seq of one value
  std::seed_seq q({static_cast<int64_t>(seed)});
  std::minstd_rand0 e(q);
  std::printf("minstd_rand0_seq %llu :", (unsigned long long)seed);
  for (int i = 0; i < 5; i++) std::printf(" %llu", (unsigned long long)e());
  std::printf("\n");
}

template <typename E, typename T>
static void uniform(const char *name, E e, T a, T b) {
  std::printf("uniform_%s %llu %llu :", name, (unsigned long long)a, (unsigned long long)b);
  for (int i = 0; i < 20; i++) {
    std::uniform_int_distribution<T> d(a, b);
    std::printf(" %llu", (unsigned long long)d(e));
  }
  std::printf(" next %llu\n", (unsigned long long)e());  // the engine's draws counted too
}

static void shuffle(size_t n) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  std::mt19937 g(524287);
  std::shuffle(v.begin(), v.end(), g);
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the values
  for (uint32_t x : v) {
    h ^= x;
    h *= 1099511628211ull;
  }
  std::printf("shuffle %zu : %llu", n, (unsigned long long)h);
  for (size_t i = 0; i < n && i < 8; i++) std::printf(" %u", v[i]);
  std::printf(" next %u\n", static_cast<uint32_t>(g()));
}

// As DALI 2.4's shuffle_after_epoch shuffles its list: mt19937_64 seeded
// with shuffle_after_epoch_seed + (k << 32) at the k-th shuffle.
static void shuffle64(size_t n, uint64_t seed) {
  std::vector<uint32_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  std::mt19937_64 g(seed);
  std::shuffle(v.begin(), v.end(), g);
  uint64_t h = 1469598103934665603ull;
  for (uint32_t x : v) {
    h ^= x;
    h *= 1099511628211ull;
  }
  std::printf("shuffle_mt19937_64 %zu %llu : %llu", n, (unsigned long long)seed, (unsigned long long)h);
  for (size_t i = 0; i < n && i < 8; i++) std::printf(" %u", v[i]);
  std::printf(" next %llu\n", (unsigned long long)g());
}

int main() {
  for (uint32_t s : {5489u, 0u, 1u, 524287u, 4294967295u}) mt(s);
  for (size_t n : {1, 2, 4, 7, 39, 68, 623, 700})
    for (auto in : std::vector<std::vector<uint32_t>>{{}, {0}, {42}, {1, 2, 3}, {4294967295u, 7, 0, 9, 11, 13, 17, 19}})
      seedseq(in, n);
  for (uint64_t s : {0ull, 1ull, 7ull, 42ull, 1234ull, 2147483647ull, 2147483648ull, 4294967295ull})
    minstd(s);
  std::seed_seq q42({42});
  std::minstd_rand0 m(q42);
  for (unsigned long b : {0ul, 1ul, 2ul, 9ul, 1023ul, 1000000ul, 2147483644ul, 2147483645ul, 2147483646ul,
                          4294967296ul, 1ul << 40, ~0ul})
    uniform<std::minstd_rand0, unsigned long>("minstd", m, 0, b);
  uniform<std::minstd_rand0, unsigned long>("minstd", m, 5, 12);
  std::mt19937 g(5489);
  for (unsigned long b : {0ul, 1ul, 6ul, 1000ul, 4294967294ul, 4294967295ul, 4294967296ul, 1ul << 40, ~0ul})
    uniform<std::mt19937, unsigned long>("mt19937", g, 0, b);
  std::mt19937_64 g64(5489);
  for (unsigned long b : {0ul, 6ul, 1ul << 40, ~0ul - 1, ~0ul})
    uniform<std::mt19937_64, unsigned long>("mt19937_64", g64, 0, b);
  for (size_t n : {0, 1, 2, 3, 4, 5, 10, 11, 1000, 65535, 65536, 65537, 100000}) shuffle(n);
  for (size_t n : {1, 2, 3, 24, 101, 65537})
    for (uint64_t s : {0ull, 524287ull + (1ull << 32), ~0ull}) shuffle64(n, s);
  return 0;
}
