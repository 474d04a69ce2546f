# SPDX-License-Identifier: Apache-2.0
"""Paired datasets read together, through a real loaderd: cases
``case_NNN_x.npy`` and ``case_NNN_y.npy`` in one folder, mapped apart
(``mkbmap --file-filter``), read by ``PairedSource`` shuffled and
sharded over several epochs: every tuple is a true pair (each case's
``x`` holds its number, its ``y`` 1000 plus it), every epoch covers the
cases once across the shards. ``zip`` of two plain sources, which ends at
the first one's end and leaves the other's unread, raises ``DriftError``
at the next pass instead of pairing batches a step apart; lists of
different lengths are refused at open."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from conftest import BIN, Daemon, Dataset, start_daemon, stop_daemon
from nvfeed import DriftError, LoaderSource, PairedSource

CASES, EPOCHS, SHARDS, BATCH = 23, 3, 2, 4


@pytest.fixture(scope="module")
def pairs(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """Datasets px and py (two maps of one folder of .npy pairs) and pz
    (the y files but one: a list one shorter)."""
    root = dataset.root.parent / "pairs"
    root.mkdir(exist_ok=True)
    for i in range(CASES):
        np.save(root / f"case_{i:03d}_x.npy", np.full((2, 3), i, np.float32))
        np.save(root / f"case_{i:03d}_y.npy", np.full((2,), 1000 + i, np.int16))
        if i:
            np.save(root / f"case_{i:03d}_z.npy", np.full((2,), 1000 + i, np.int16))
    subprocess.run(["sync"], check=True)
    maps = tmp_path_factory.mktemp("pairs-maps")
    args = []
    for part in ("x", "y", "z"):
        out = maps / f"{part}.bmap"
        subprocess.run([str(BIN / "mkbmap"), "--reader", "numpy", "--file-filter", f"*_{part}.npy", "--mountpoint",
                        str(root), "-o", str(out)], check=True, capture_output=True)
        args += ["--dataset", f"p{part}={out}"]
    d = start_daemon(tmp_path_factory.mktemp("pairs"), dataset.bmap, *args)
    yield d
    assert stop_daemon(d) == 0, d.log.read_text()


def _case_of(x: np.ndarray, y: np.ndarray) -> list[int]:
    """The cases of a batch's rows, asserting each row's x and y pair."""
    xs = [int(r[0, 0]) for r in x]
    ys = [int(r[0]) - 1000 for r in y]
    assert xs == ys, f"x of cases {xs} came with y of cases {ys}"
    return xs


def test_paired_source_pairs_every_batch(pairs: Daemon) -> None:
    """Shuffled, sharded, three epochs: every tuple pairs, and each epoch
    covers every case once across the shards."""
    parts = [PairedSource(["px", "py"], socket=pairs.socket, batch_size=BATCH, shard_id=k, num_shards=SHARDS,
                          random_shuffle=True, seed=9) for k in range(SHARDS)]
    try:
        orders = []
        for epoch in range(EPOCHS):
            seen: list[int] = []
            for src in parts:
                batches = 0
                for x, y in src:
                    seen += _case_of(x, y)
                    batches += 1
                assert batches == len(src)
            assert sorted(seen) == list(range(CASES)), f"epoch {epoch}: {sorted(seen)}"
            orders.append(seen)
        assert orders[0] != orders[1], "the shuffle drew one order twice"
    finally:
        for src in parts:
            src.close()


def test_paired_source_resumes(pairs: Daemon) -> None:
    """state() taken mid-epoch resumes every part at the same batch."""
    kw = dict(socket=pairs.socket, batch_size=BATCH, random_shuffle=True, seed=4)
    with PairedSource(["px", "py"], **kw) as src:
        it = iter(src)
        next(it)
        st = src.state()
        rest = [_case_of(x, y) for x, y in it]
    with PairedSource(["px", "py"], state=st, **kw) as again:
        assert [_case_of(x, y) for x, y in again] == rest


def test_paired_source_refuses_lists_that_cannot_pair(pairs: Daemon) -> None:
    with pytest.raises(DriftError, match="cannot pair"):
        PairedSource(["px", "pz"], socket=pairs.socket, batch_size=BATCH)
    with pytest.raises(ValueError, match="two datasets or more"):
        PairedSource(["px"], socket=pairs.socket)
    # A sample skipped in one part and not its twin would shift every later
    # pair, with the same positions and indices on both: refused.
    for arg in ("on_error", "missing_component_behavior"):
        with pytest.raises(ValueError, match=f"{arg}='skip' would leave a sample out of one part"):
            PairedSource(["px", "py"], socket=pairs.socket, batch_size=BATCH, **{arg: "skip"})


def test_zip_of_two_sources_raises_at_the_drift(pairs: Daemon) -> None:
    """zip(a, b) ends at a's end of epoch, leaving b's end unread: the
    next pass over b raises DriftError instead of pairing every batch
    with its twin's predecessor. Every tuple zip gave before it paired."""
    kw = dict(socket=pairs.socket, batch_size=BATCH, random_shuffle=True, seed=3)
    with LoaderSource("px", **kw) as a, LoaderSource("py", **kw) as b:
        got = 0
        with pytest.raises(DriftError, match="zip"):
            for _ in range(EPOCHS):
                for x, y in zip(a, b):
                    _case_of(x, y)
                    got += 1
        assert got == len(a)


def test_paired_source_raises_when_parts_disagree(pairs: Daemon) -> None:
    """Parts resumed at different batches: the first step raises
    DriftError naming both positions, rather than yield a tuple that does
    not pair."""
    kw = dict(socket=pairs.socket, batch_size=BATCH, random_shuffle=True, seed=4)
    with PairedSource(["px", "py"], **kw) as src:
        st = src.state()
        next(iter(src))
        ahead = src.state()
    with PairedSource(["px", "py"], state=[st[0], ahead[1]], **kw) as skewed:
        with pytest.raises(DriftError, match="returned epoch/batch"):
            next(iter(skewed))
