# SPDX-License-Identifier: Apache-2.0
"""src.samples and src.labels: one batch's halves through two external
sources, whichever DALI calls first; out-of-order calls raise. Unit
tests of the pairing, then real DALI (CPU) pipelines over the daemon
double."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

import numpy as np
import pytest

from fakedaemon import FakeDaemon
from nvfeed import LoaderError, LoaderSource
from nvfeed._pair import BatchHalves, Position


class Batches:
    """fetch for BatchHalves: batch k is ("s<k>", "l<k>"), n per epoch."""

    def __init__(self, n: int = 3) -> None:
        self.n, self.k, self.asked = n, 0, []  # type: ignore[var-annotated]

    def __call__(self, at: Optional[Position]) -> tuple[Position, Any, Any]:
        self.asked.append(at)
        if at is not None:
            self.k = at[1]
        if self.k >= self.n:
            self.k = 0
            raise StopIteration
        k, self.k = self.k, self.k + 1
        return (0, k), f"s{k}", f"l{k}"


@pytest.mark.parametrize("order", [(0, 1), (1, 0)], ids=["samples-first", "labels-first"])
def test_halves_pair_in_either_order(order: tuple[int, int]) -> None:
    b = Batches()
    h = BatchHalves()
    for k in range(3):
        got = {half: h.take(half, None, b) for half in order}
        assert got == {0: f"s{k}", 1: f"l{k}"}
    for half in order:  # the end of the epoch: both halves stop
        with pytest.raises(StopIteration):
            h.take(half, None, b)
    assert h.take(order[1], None, b) == ("s0", "l0")[order[1]]  # the next epoch, from either side
    assert h.take(order[0], None, b) == ("s0", "l0")[order[0]]
    assert b.asked == [None] * 5


@pytest.mark.parametrize("half,name,other", [(0, "samples", "labels"), (1, "labels", "samples")])
def test_halves_twice_is_an_error(half: int, name: str, other: str) -> None:
    h = BatchHalves()
    b = Batches()
    h.take(half, None, b)
    with pytest.raises(LoaderError, match=rf"LoaderSource.{name} asked for twice before LoaderSource.{other} took its "
                                          r"half of epoch 0 batch 0: pass src.samples and src.labels"):
        h.take(half, None, b)
    assert h.take(1 - half, None, b) == ("s0", "l0")[1 - half]  # the waiting half is still there


def test_halves_twice_at_the_end_of_an_epoch() -> None:
    h = BatchHalves()
    b = Batches(n=0)
    with pytest.raises(StopIteration):
        h.take(0, None, b)
    with pytest.raises(LoaderError, match="before LoaderSource.labels took its half of the end of the epoch"):
        h.take(0, None, b)


def test_halves_batch_info() -> None:
    """With DALI's BatchInfo the first half fetches that batch; the second
    must ask for the same one. An iteration number (what DALI passes
    without batch_info=True) asks for the next batch in order."""
    b = Batches(n=5)
    h = BatchHalves()
    info = SimpleNamespace(epoch_idx=0, iteration=2)
    assert h.take(1, info, b) == "l2" and h.take(0, info, b) == "s2"
    assert h.take(0, 7, b) == "s3" and h.take(1, 7, b) == "l3"
    assert b.asked == [(0, 2), None]
    h.take(0, SimpleNamespace(epoch_idx=0, iteration=4), b)
    with pytest.raises(LoaderError, match="LoaderSource.labels asked for epoch 0 batch 1, but LoaderSource.samples "
                                          "took epoch 0 batch 4"):
        h.take(1, SimpleNamespace(epoch_idx=0, iteration=1), b)
    with pytest.raises(TypeError, match="BatchInfo"):
        h.take(1, "x", b)


def test_source_halves_without_dali(monkeypatch: pytest.MonkeyPatch) -> None:
    """LoaderSource.samples/labels over a (host) source: the labels of the
    batch whose samples went out, in either order; close forgets a half."""
    d = FakeDaemon(batches=3)
    d.install(monkeypatch, None)
    with LoaderSource("train", socket="/x", batch_size=3, transport="http") as src:
        s = src.samples()
        labels = src.labels()
        assert [int(x[0]) for x in s] == labels.reshape(-1).tolist() == [0, 1, 2]
        labels = src.labels()
        s = src.samples()
        assert [int(x[0]) for x in s] == labels.reshape(-1).tolist() == [3, 4, 5]
        src.samples()
        with pytest.raises(LoaderError, match="asked for twice"):
            src.samples()
    del s
    d.close_fds()


dali = pytest.importorskip("nvidia.dali")


@pytest.mark.parametrize("batch_info", [False, True])
@pytest.mark.parametrize("batch_format", ["numpy", "dali"])
def test_dali_pipeline_two_sources(monkeypatch: pytest.MonkeyPatch, batch_format: str, batch_info: bool) -> None:
    """A real DALI pipeline (CPU) with fn.external_source(source=src.samples)
    and fn.external_source(source=src.labels): every sample's label is
    its own (the double writes the label into the sample's bytes) for two
    epochs, the epoch ends in both sources at once."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    d = FakeDaemon(batches=4, batch_size=3, sample=64)
    d.install(monkeypatch, None)
    src = LoaderSource("train", socket="/x", batch_size=3, transport="http", batch_format=batch_format)  # type: ignore[arg-type]

    @pipeline_def(batch_size=3, num_threads=1, device_id=None, prefetch_queue_depth=2)
    def pipe():  # type: ignore[no-untyped-def]
        data = fn.external_source(source=src.samples, batch=True, no_copy=True, dtype=types.UINT8,
                                  batch_info=batch_info)
        labels = fn.external_source(source=src.labels, batch=True, dtype=types.INT32, batch_info=batch_info)
        return data, labels

    p = pipe()
    p.build()
    try:
        for epoch in range(2):
            seen = []
            for _ in range(4):
                data, labels = p.run()
                for i in range(len(data)):
                    sample, label = np.array(data[i]), int(np.array(labels[i]).reshape(-1)[0])
                    assert sample.shape == (64,) and set(sample.tolist()) == {label}, (epoch, i)
                    seen.append(label)
            assert seen == list(range(12)), epoch
            with pytest.raises(StopIteration):
                p.run()
            p.reset()
    finally:
        del p
        src.close()
        d.close_fds()
