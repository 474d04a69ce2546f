# SPDX-License-Identifier: Apache-2.0
"""nnU-Net's DALI loader structure (NVIDIA DeepLearningExamples,
PyTorch/Segmentation/nnUNet/data_loading/dali_loader.py), adapted: cases
``case_NNN_x.npy`` (image) and ``case_NNN_y.npy`` (label) in one folder,
mapped apart (``mkbmap --file-filter``), read by two sources with
``shuffle_after_epoch=True`` and ``num_shards`` ranks, as the two
``fn.readers.numpy`` readers nnU-Net builds. Every epoch, every rank's
images come with their own labels, the shards are disjoint and cover the
cases, whatever the seeds (nnU-Net runs unseeded: each reader then gets
its own derived seed). Real DALI, CPU: ``fn.readers.numpy`` with
``shuffle_after_epoch`` (and ``shuffle_after_epoch_seed``) reads, epoch
by epoch, the very order the sources read. The performance-only and unsupported ``fn.readers.numpy`` arguments are
judged at the call that names them."""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from conftest import BIN, Daemon, Dataset, skip_unprivileged, start_daemon, stop_daemon
from nvfeed import LoaderSource

CASES, EPOCHS = 23, 3


@pytest.fixture(scope="module")
def paired(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    root = dataset.root.parent / "nnunet"
    root.mkdir(exist_ok=True)
    for i in range(CASES):
        np.save(root / f"case_{i:03d}_x.npy", np.full((2, 3), i, np.float32))
        np.save(root / f"case_{i:03d}_y.npy", np.full((2,), 1000 + i, np.int16))
    subprocess.run(["sync"], check=True)
    maps = tmp_path_factory.mktemp("nnunet-maps")
    args = []
    for part in ("x", "y"):
        out = maps / f"{part}.bmap"
        r = subprocess.run([str(BIN / "mkbmap"), "--reader", "numpy", "--file-filter", f"*_{part}.npy",
                            "--mountpoint", str(root), "-o", str(out)], capture_output=True, text=True)
        if r.returncode != 0:
            skip_unprivileged(f"mkbmap: {r.stderr.strip()}")
        args += ["--dataset", f"{part}={out}"]
    d = start_daemon(tmp_path_factory.mktemp("nnunet"), dataset.bmap, *args)
    yield d, root
    assert stop_daemon(d) == 0, d.log.read_text()


def _epochs(src: LoaderSource) -> list[list[int]]:
    out: list[list[int]] = []
    for _ in range(EPOCHS):
        out.append([int(np.asarray(a).reshape(-1)[0]) for b in src for a in b])
    return out


@pytest.mark.parametrize("shards", [1, 2, 3])
@pytest.mark.parametrize("seeded", [True, False])
def test_pairs_stay_paired(paired: tuple[Daemon, Path], shards: int, seeded: bool) -> None:
    d, _ = paired
    per_epoch: list[set[int]] = [set() for _ in range(EPOCHS)]
    for rank in range(shards):
        seeds = (12, 12) if seeded else (rank * 7919 + 1, rank * 104729 + 5)  # unseeded: each reader its own
        kw: dict[str, Any] = dict(socket=d.socket, batch_size=2, shard_id=rank, num_shards=shards,
                                  shuffle_after_epoch=True, pad_last_batch=True)
        with LoaderSource("x", seed=seeds[0], **kw) as xs, LoaderSource("y", seed=seeds[1], **kw) as ys:
            images, labels = _epochs(xs), _epochs(ys)
        for e in range(EPOCHS):
            assert [v + 1000 for v in images[e]] == labels[e], f"rank {rank} epoch {e}: images and labels unpaired"
            lo, hi = rank * CASES // shards, (rank + 1) * CASES // shards
            own = images[e][:hi - lo]
            assert not per_epoch[e] & set(own), f"epoch {e}: rank {rank} reads cases another rank read"
            per_epoch[e] |= set(own)
        if shards == 1:
            assert images[0] != images[1], "the list was not shuffled after epoch 0"
    assert all(s == set(range(CASES)) for s in per_epoch)


@pytest.mark.parametrize("after_seed", [None, 0, -5, 2**40 + 3])
def test_dali_order(paired: tuple[Daemon, Path], after_seed: Any) -> None:
    """fn.readers.numpy(shuffle_after_epoch=True) over 2 shards reads, epoch
    by epoch, exactly what the sources read (DALI 2.4's order), for DALI's
    default ``shuffle_after_epoch_seed`` and given ones; pairs intact."""
    fn = pytest.importorskip("nvidia.dali.fn")
    dali = pytest.importorskip("nvidia.dali")
    d, root = paired
    given = {} if after_seed is None else {"shuffle_after_epoch_seed": after_seed}
    batches = -(-(-(-CASES // 2)) // 2)
    for rank in range(2):
        @dali.pipeline_def(batch_size=2, num_threads=1, device_id=None)
        def pipe() -> Any:
            kw = dict(file_root=str(root), shard_id=rank, num_shards=2, shuffle_after_epoch=True, pad_last_batch=True,
                      **given)
            return fn.readers.numpy(file_filter="*_x.npy", **kw), fn.readers.numpy(file_filter="*_y.npy", **kw)
        p = pipe()
        p.build()
        want_x, want_y = [], []
        for _ in range(EPOCHS):
            xs, ys = [], []
            for _ in range(batches):
                x, y = p.run()
                xs += [int(np.array(x[i]).reshape(-1)[0]) for i in range(len(x))]
                ys += [int(np.array(y[i]).reshape(-1)[0]) for i in range(len(y))]
            want_x.append(xs)
            want_y.append(ys)
        kw: dict[str, Any] = dict(socket=d.socket, batch_size=2, shard_id=rank, num_shards=2,
                                  shuffle_after_epoch=True, pad_last_batch=True, **given)
        with LoaderSource("x", seed=rank + 1, **kw) as xs_src, LoaderSource("y", seed=rank + 7, **kw) as ys_src:
            assert _epochs(xs_src) == want_x, f"rank {rank}: the images' order is not fn.readers.numpy's"
            assert _epochs(ys_src) == want_y, f"rank {rank}: the labels' order is not fn.readers.numpy's"
        assert [[v + 1000 for v in e] for e in want_x] == want_y


def test_shuffle_after_epoch_seed_range(paired: tuple[Daemon, Path]) -> None:
    """DALI's int64: a seed past it is refused at the call (DALI would use
    its default silently)."""
    d, _ = paired
    for bad in (2**63, -(2**63) - 1, "7", 1.5):
        with pytest.raises(ValueError, match="shuffle_after_epoch_seed must be"):
            LoaderSource("x", socket=d.socket, shuffle_after_epoch=True, shuffle_after_epoch_seed=bad)


def test_dali_arguments_judged_at_the_call(paired: tuple[Daemon, Path]) -> None:
    d, _ = paired
    with pytest.warns(RuntimeWarning, match="read_ahead= is a fn.readers.numpy"):
        with LoaderSource("x", socket=d.socket, batch_size=2, read_ahead=True, dont_use_mmap=True):
            pass
    with pytest.raises(TypeError, match="file_root= is a fn.readers.numpy.*nvfeed does not support"):
        LoaderSource("x", socket=d.socket, file_root=[1])
    with pytest.raises(ValueError, match="out_of_bounds_policy= must be one of"):  # regions: test_roi.py
        LoaderSource("x", socket=d.socket, roi_start=[1], out_of_bounds_policy=[1])
    with pytest.raises(ValueError, match="shuffle_after_epoch cannot be true with random_shuffle"):
        LoaderSource("x", socket=d.socket, shuffle_after_epoch=True, random_shuffle=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
            LoaderSource("x", socket=d.socket, bogus=1)
