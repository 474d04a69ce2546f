# SPDX-License-Identifier: Apache-2.0
"""The seeds a DALI pipeline gives its operators: ``std::seed_seq`` of
the pipeline's seed, in pure Python (no DALI needed), so that
``nvfeed.dali.reader`` takes the seed ``fn.readers.file`` would have."""

from __future__ import annotations

MAX_SEEDS = 1024
"""DALI's pipeline draws this many operator seeds from its own seed."""


def seed_for(pipeline_seed: int, slot: int = 0) -> int:
    """The seed DALI gives the ``slot``-th operator (counting those that
    take a seed and were given none, in graph order) of a pipeline with
    ``seed=pipeline_seed``: ``std::seed_seq{seed}.generate`` of 1024 seeds,
    its entry ``slot``. ``fn.readers.file`` feeding a pipeline's first
    output is slot 0."""
    if not 0 <= slot < MAX_SEEDS:
        raise ValueError(f"slot must be in [0, {MAX_SEEDS}), got {slot}")
    return _seed_seq(pipeline_seed, MAX_SEEDS)[slot]


def _seed_seq(seed: int, n: int) -> list[int]:
    """std::seed_seq{seed}.generate(n values), as the C++ standard
    ([rand.util.seedseq]) specifies it: 32-bit words."""
    m32 = 0xFFFFFFFF
    v = [seed & m32]
    s = len(v)
    b = [0x8B8B8B8B] * n
    t = 11 if n >= 623 else 7 if n >= 68 else 5 if n >= 39 else 3 if n >= 7 else (n - 1) // 2
    p = (n - t) // 2
    q = p + t
    m = max(s + 1, n)

    def mix(x: int) -> int:
        return x ^ (x >> 27)
    for k in range(m):
        r1 = 1664525 * mix(b[k % n] ^ b[(k + p) % n] ^ b[(k - 1) % n]) & m32
        r2 = (r1 + (s if k == 0 else k % n + v[k - 1] if k <= s else k % n)) & m32
        b[(k + p) % n] = (b[(k + p) % n] + r1) & m32
        b[(k + q) % n] = (b[(k + q) % n] + r2) & m32
        b[k % n] = r2
    for k in range(m, m + n):
        r3 = 1566083941 * mix((b[k % n] + b[(k + p) % n] + b[(k - 1) % n]) & m32) & m32
        r4 = (r3 - k % n) & m32
        b[(k + p) % n] ^= r3
        b[(k + q) % n] ^= r4
        b[k % n] = r4
    return b
