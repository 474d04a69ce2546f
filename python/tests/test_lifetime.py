# SPDX-License-Identifier: Apache-2.0
"""How long a batch ``LoaderSource`` hands out stays valid, through a real
loaderd: iterated by user code (``list(src)``, a loop that keeps
batches) every batch is a copy that keeps the bytes it was delivered
with, for a tensor (numpy) dataset and an image dataset, compared with
the files' bytes; with ``zero_copy=True`` the batches view the batch
memory, read-only, valid until ``release_after`` more batches were taken
(as documented); fed to DALI they stay views (DALI copies them or
``release_after`` covers its queue)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from conftest import BIN, Daemon, Dataset, start_daemon, stop_daemon
from nvfeed import LoaderSource

N, BATCH = 50, 2  # 25 tensor batches, as the user's report had


@pytest.fixture(scope="module")
def volumes(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, list[np.ndarray]]]:
    """A numpy dataset of N (4, 5) float32 arrays, each its own values,
    served as "volumes" (with the image dataset "train"); the arrays in
    fn.readers.numpy's order, loaded from the files."""
    root = dataset.root.parent / "volumes"
    root.mkdir(exist_ok=True)
    rng = np.random.default_rng(11)
    for i in range(N):
        np.save(root / f"v{i:03d}.npy", rng.standard_normal((4, 5)).astype(np.float32))
    subprocess.run(["sync"], check=True)
    out = tmp_path_factory.mktemp("volumes-map") / "volumes.bmap"
    subprocess.run([str(BIN / "mkbmap"), "--reader", "numpy", "--mountpoint", str(root), "-o", str(out)], check=True,
                   capture_output=True)
    d = start_daemon(tmp_path_factory.mktemp("volumes"), dataset.bmap, "--dataset", f"volumes={out}")
    yield d, [np.load(root / f"v{i:03d}.npy") for i in range(N)]
    assert stop_daemon(d) == 0, d.log.read_text()


def test_kept_tensor_batches_keep_their_bytes(volumes: tuple[Daemon, list[np.ndarray]]) -> None:
    """list(LoaderSource(...)) over a numpy dataset: every kept batch still
    holds the arrays it was delivered with (the files'), and is writable
    memory of its own."""
    d, arrays = volumes
    with LoaderSource("volumes", socket=d.socket, batch_size=BATCH) as src:
        kept = list(src)
    assert len(kept) == N // BATCH
    changed = [k for k, b in enumerate(kept) if not np.array_equal(b, np.stack(arrays[k * BATCH:(k + 1) * BATCH]))]
    assert not changed, f"{len(changed)} of {len(kept)} kept batches no longer hold what was delivered: {changed}"
    kept[0][0, 0, 0] = 7.0  # a copy: writable, and no other batch changes
    assert np.array_equal(kept[1], np.stack(arrays[BATCH:2 * BATCH]))


@pytest.mark.parametrize("batch_format", ["numpy", "dali"])
def test_kept_image_batches_keep_their_bytes(daemon: Daemon, dataset: Dataset, batch_format: str) -> None:
    """list(LoaderSource(...)) over an image dataset, shuffled, two epochs:
    every kept sample is still its file's bytes with its label, and each
    epoch's batches hold every file once (DALI tensor lists too)."""
    with LoaderSource("train", socket=daemon.socket, batch_size=4, random_shuffle=True, seed=5,
                      batch_format=batch_format) as src:  # type: ignore[arg-type]
        epochs = [list(src), list(src)]
    for kept in epochs:
        seen = []
        for samples, labels in kept:
            if batch_format == "dali":
                samples, labels = [np.array(samples[i]) for i in range(len(samples))], labels.as_array()
            for s, lab in zip(samples, labels.reshape(-1)):
                h = hashlib.sha256(s.tobytes()).hexdigest()
                assert h in dataset.by_hash, f"a kept sample is no longer any file's bytes ({len(seen)} were)"
                assert dataset.by_hash[h][1] == int(lab)
                seen.append(dataset.by_hash[h][0])
        assert sorted(seen) == sorted(p for p, _ in dataset.files)


def test_zero_copy_views_last_release_after_batches(volumes: tuple[Daemon, list[np.ndarray]]) -> None:
    """zero_copy=True: the batches view the batch memory, read-only, and a
    batch holds its arrays while no more than release_after later batches
    were taken (the documented lifetime)."""
    d, arrays = volumes
    with LoaderSource("volumes", socket=d.socket, batch_size=BATCH, zero_copy=True) as src:
        assert src.zero_copy
        window: list[tuple[int, Any]] = []
        for k, b in enumerate(src):
            assert not b.flags.writeable
            with pytest.raises(ValueError):
                b[0, 0, 0] = 1.0
            window.append((k, b))
            window = window[-(src._session.release_after + 1):]  # this batch and release_after before it
            for j, held in window:
                assert np.array_equal(held, np.stack(arrays[j * BATCH:(j + 1) * BATCH])), f"batch {j} at batch {k}"


def test_zero_copy_is_checked(volumes: tuple[Daemon, list[np.ndarray]]) -> None:
    with pytest.raises(ValueError, match="zero_copy must be True or False"):
        LoaderSource("volumes", socket=volumes[0].socket, zero_copy=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("how", ["iterable", "batch_info"])
def test_dali_consumes_views(daemon: Daemon, dataset: Dataset, how: str) -> None:
    """Fed to DALI's fn.external_source(no_copy=True), as an iterable or as
    src.batch with batch_info, the source hands out views of its batch
    memory (no copy: release_after covers DALI's queue), and the
    pipeline's outputs are the files' bytes."""
    from nvidia.dali import fn, pipeline_def, types

    src = LoaderSource("train", socket=daemon.socket, batch_size=4, random_shuffle=True, seed=2)
    views = []
    mem = (src._session._buf.ctypes.data, src._session._buf.ctypes.data + src._session._buf.size)

    def watch(b: Any) -> Any:
        views.extend(mem[0] <= s.ctypes.data < mem[1] for s in b[0])
        return b

    class Watched:
        def __iter__(self) -> Any:
            iter(src)
            return self

        def __next__(self) -> Any:
            return watch(next(src))

    @pipeline_def(batch_size=4, num_threads=1, device_id=None, prefetch_queue_depth=2)
    def pipe() -> Any:
        if how == "iterable":
            jpegs, labels = fn.external_source(source=Watched(), num_outputs=2, batch=True, no_copy=True,
                                               dtype=[types.UINT8, types.INT32])
        else:
            jpegs, labels = fn.external_source(source=lambda info: watch(src.batch(info)), num_outputs=2,
                                               batch=True, batch_info=True, no_copy=True,
                                               dtype=[types.UINT8, types.INT32])
        return jpegs, labels

    p = pipe()
    p.build()
    seen = []
    try:
        while True:
            jpegs, labels = p.run()
            for i in range(len(jpegs)):
                h = hashlib.sha256(np.array(jpegs[i]).tobytes()).hexdigest()
                assert dataset.by_hash[h][1] == int(np.array(labels[i])[0])
                seen.append(h)
    except StopIteration:
        pass
    src.close()
    assert sorted(seen) == sorted(dataset.by_hash)
    assert views and all(views), "DALI was handed copies"


def test_a_source_that_fed_dali_copies_for_a_loop_of_its_own(daemon: Daemon, dataset: Dataset) -> None:
    """A source that fed a DALI pipeline (built, so DALI took its
    iterator) and is then read by the user's own loop (a look at a few
    batches, statistics, a notebook): that loop gets copies, not views
    the daemon reuses. Only a call from DALI's code gets views."""
    dali = pytest.importorskip("nvidia.dali")
    fn, types = dali.fn, dali.types
    src = LoaderSource("train", socket=daemon.socket, batch_size=4)

    @dali.pipeline_def(batch_size=4, num_threads=1, device_id=None)
    def pipe() -> Any:
        return tuple(fn.external_source(source=src, num_outputs=2, batch=True, no_copy=True,
                                        dtype=[types.UINT8, types.INT32]))

    p = pipe()
    p.build()
    kept = list(src)  # the user's loop, outside DALI
    seen = []
    for samples, labels in kept:
        for s, lab in zip(samples, labels.reshape(-1)):
            h = hashlib.sha256(s.tobytes()).hexdigest()
            assert h in dataset.by_hash, f"a kept sample is no longer any file's bytes ({len(seen)} were)"
            assert dataset.by_hash[h][1] == int(lab)
            seen.append(dataset.by_hash[h][0])
    assert sorted(seen) == sorted(path for path, _ in dataset.files)
    src.close()
