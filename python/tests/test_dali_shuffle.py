# SPDX-License-Identifier: Apache-2.0
"""Real DALI, CPU only: LoaderSource(shuffle="dali") gives exactly the
samples fn.readers.file(random_shuffle=True) gives, in the same order, for
3 epochs, over several dataset sizes, batch sizes, initial_fill, seeds,
shards, pad_last_batch and stick_to_shard; stick_to_shard keeps a shard's
samples fixed across epochs as DALI does, in either shuffle; a state
taken mid-run resumes DALI's order exactly."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from conftest import BIN, Daemon, Dataset, skip_unprivileged, start_daemon, stop_daemon
from nvfeed import LoaderSource

try:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def
except Exception as e:  # noqa: BLE001 - any import failure means no DALI here
    pytest.skip(f"cannot import nvidia.dali: {e!r}", allow_module_level=True)

EPOCHS = 3
SIZES = (101, 257)


@pytest.fixture(scope="module")
def datasets(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, dict[int, Path]]]:
    """Datasets of SIZES samples in 3 classes, every file's bytes unique
    (its name), on the shared dataset's filesystem; one daemon serving
    them as "s101", "s257"."""
    roots: dict[int, Path] = {}
    args: list[str] = []
    for n in SIZES:
        root = dataset.root.parent / f"shuffle{n}"
        for i in range(n):
            p = root / f"c{i % 3}" / f"{i:04d}.jpg"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(f"sample {i} of {n}".encode() * (1 + i % 4))
        os.sync()
        bmap = dataset.root.parent / f"shuffle{n}.bmap"
        r = subprocess.run([str(BIN / "mkbmap"), "--mountpoint", str(root), "-o", str(bmap)], capture_output=True, text=True)
        if r.returncode != 0:
            skip_unprivileged(f"mkbmap: {r.stderr.strip()}")
        roots[n] = root
        args += ["--dataset", f"s{n}={bmap}"]
    d = start_daemon(tmp_path_factory.mktemp("shuffle"), dataset.bmap, *args)
    yield d, roots
    assert stop_daemon(d) == 0, d.log.read_text()


def _reader(root: Path, n_batches: int, *, batch_size: int, **kw: Any) -> list[bytes]:
    """The first n_batches batches of fn.readers.file, one flat list of
    sample bytes."""
    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None, seed=99)
    def pipe():
        jpegs, _ = fn.readers.file(file_root=str(root), **kw)
        return jpegs

    p = pipe()
    p.build()
    out: list[bytes] = []
    for _ in range(n_batches):
        (data,) = p.run()
        out += [np.array(data[i]).tobytes() for i in range(len(data))]
    return out


def _epochs(src: LoaderSource, epochs: int) -> list[list[bytes]]:
    """The source's next epochs, each a list of sample bytes."""
    return [[bytes(s) for samples, _ in src for s in samples] for _ in range(epochs)]


# (dataset size, batch_size, initial_fill, seed, num_shards, shard_id, pad_last_batch, stick_to_shard)
CASES = [
    (101, 8, 1024, 0, 1, 0, False, False),
    (101, 8, 16, 42, 3, 1, False, False),
    (101, 8, 16, 42, 3, 2, True, False),
    (101, 5, 7, 11, 4, 3, False, True),
    (257, 16, 100, 7, 2, 1, True, True),
    (257, 10, 32, 2**32 + 3, 4, 0, False, False),
    (257, 32, 1, 5, 8, 6, True, False),
    (257, 64, 300, 123456789, 1, 0, True, False),
]


@pytest.mark.parametrize("case", CASES, ids=[",".join(map(str, c)) for c in CASES])
def test_dali_shuffle_matches_readers_file(datasets: tuple[Daemon, dict[int, Path]], case: tuple) -> None:
    d, roots = datasets
    n, bs, fill, seed, shards, sid, pad, stick = case
    args = dict(batch_size=bs, seed=seed, num_shards=shards, shard_id=sid, pad_last_batch=pad, stick_to_shard=stick)
    with LoaderSource(f"s{n}", socket=d.socket, random_shuffle=True, shuffle="dali", initial_fill=fill, **args) as src:  # type: ignore[arg-type]
        got = _epochs(src, EPOCHS)
    per = -(-n // shards)
    for e, samples in enumerate(got):
        k = sid if stick else (sid + e) % shards
        size = (k + 1) * n // shards - k * n // shards
        assert len(samples) == (-(-per // bs) * bs if pad else size), f"epoch {e}: {len(samples)} samples"
    flat = [s for ep in got for s in ep]
    want = _reader(roots[n], -(-len(flat) // bs), random_shuffle=True, initial_fill=fill, **args)
    assert len(want) >= len(flat)
    for i, (g, w) in enumerate(zip(flat, want)):
        assert g == w, f"sample {i} (epoch {next(e for e in range(EPOCHS) if i < sum(map(len, got[:e + 1])))}): {g!r} here, DALI {w!r}"
    # Not a trivial order: the shuffle moved samples, and epochs differ.
    assert got[0] != sorted(got[0]) and got[0] != got[1]


def test_dali_shuffle_unshuffled_is_sequential(datasets: tuple[Daemon, dict[int, Path]]) -> None:
    """random_shuffle=False: both shuffles read in DALI's sequential order."""
    d, roots = datasets
    args = dict(batch_size=8, num_shards=3, shard_id=1, pad_last_batch=True)
    want = _reader(roots[101], 3 * 5, random_shuffle=False, **args)
    for mode in ("dali", "permute"):
        with LoaderSource("s101", socket=d.socket, random_shuffle=False, shuffle=mode, **args) as src:  # type: ignore[arg-type]
            got = [s for ep in _epochs(src, EPOCHS) for s in ep]
        assert got == want[:len(got)], f"shuffle={mode}"


@pytest.mark.parametrize("mode", ["dali", "permute"])
def test_stick_to_shard_keeps_dali_shard(datasets: tuple[Daemon, dict[int, Path]], mode: str) -> None:
    """stick_to_shard with random_shuffle: every epoch reads the samples of
    DALI's shard, the same set every epoch (DALI's own epochs checked too),
    newly ordered each epoch."""
    d, roots = datasets
    n, bs, shards, sid = 257, 10, 3, 1
    args = dict(batch_size=bs, seed=3, num_shards=shards, shard_id=sid, stick_to_shard=True)
    size = (sid + 1) * n // shards - sid * n // shards
    dali = _reader(roots[n], -(-EPOCHS * size // bs), random_shuffle=True, initial_fill=64, **args)
    dali_sets = [set(dali[e * size:(e + 1) * size]) for e in range(EPOCHS)]
    assert len(dali_sets[0]) == size and dali_sets[0] == dali_sets[1] == dali_sets[2], "DALI's stick_to_shard keeps its shard"
    with LoaderSource(f"s{n}", socket=d.socket, random_shuffle=True, shuffle=mode, initial_fill=64, **args) as src:  # type: ignore[arg-type]
        got = _epochs(src, EPOCHS)
    for e, samples in enumerate(got):
        assert len(samples) == size
        kept = len(set(samples) & dali_sets[0])
        assert kept == size, f"shuffle={mode} epoch {e}: {kept} of DALI's {size} shard samples"
    assert got[0] != got[1] != got[2]


def test_dali_shuffle_resumes_and_swaps_into_a_pipeline(datasets: tuple[Daemon, dict[int, Path]]) -> None:
    """fn.external_source(LoaderSource(shuffle="dali")) in a pipeline gives
    fn.readers.file's batches (pad_last_batch: DALI's batches are whole
    epochs' here), and a state taken in epoch 1 resumes the same
    sequence."""
    d, roots = datasets
    n, bs = 101, 8
    args = dict(batch_size=bs, seed=21, num_shards=2, shard_id=0, pad_last_batch=True)
    want = _reader(roots[n], 3 * 7, random_shuffle=True, initial_fill=40, **args)  # 51 samples padded to 56: 7 batches

    src = LoaderSource(f"s{n}", socket=d.socket, random_shuffle=True, shuffle="dali", initial_fill=40, **args)  # type: ignore[arg-type]

    @pipeline_def(batch_size=bs, num_threads=1, device_id=None, seed=1)
    def ext():
        jpegs, _ = fn.external_source(source=src, num_outputs=2, batch=True, no_copy=True, dtype=[types.UINT8, types.INT32])
        return jpegs

    p = ext()
    p.build()
    got: list[bytes] = []
    try:
        for _ in range(3):
            while True:
                try:
                    (data,) = p.run()
                except StopIteration:
                    p.reset()
                    break
                got += [np.array(data[i]).tobytes() for i in range(len(data))]
    finally:
        src.close()
    assert got == want

    with LoaderSource(f"s{n}", socket=d.socket, random_shuffle=True, shuffle="dali", initial_fill=40, **args) as a:  # type: ignore[arg-type]
        head = _epochs(a, 1)[0]
        it = iter(a)
        head += [bytes(s) for s in next(it)[0]] + [bytes(s) for s in next(it)[0]]
        st = a.state()
    assert st["sampling"]["shuffle"] == "dali" and st["sampling"]["initial_fill"] == 40 and (st["epoch"], st["batch"]) == (1, 2)
    with LoaderSource(f"s{n}", socket=d.socket, random_shuffle=True, shuffle="dali", initial_fill=40, state=st, **args) as b:  # type: ignore[arg-type]
        tail = [bytes(s) for samples, _ in b for s in samples] + [s for ep in _epochs(b, 1) for s in ep]
    assert head + tail == want


def test_shuffle_arguments_are_checked(datasets: tuple[Daemon, dict[int, Path]]) -> None:
    d, _ = datasets
    with pytest.raises(ValueError, match="shuffle must be 'permute' or 'dali', got 'buffer'"):
        LoaderSource("s101", socket=d.socket, shuffle="buffer")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"initial_fill must be an int in \[1, 16777216\], got 0"):
        LoaderSource("s101", socket=d.socket, shuffle="dali", initial_fill=0)
