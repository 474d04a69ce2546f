# SPDX-License-Identifier: Apache-2.0
"""Real DALI, CPU only: fn.readers.file and fn.external_source(LoaderSource)
yield the same bytes, labels and decoded images for a whole epoch."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import Daemon, Dataset, small_dataset, start_daemon, stop_daemon
from nvfeed import LoaderSource

try:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def
except Exception as e:  # noqa: BLE001 - any import failure means no DALI here
    print(f"DALI tests skip: cannot import nvidia.dali: {e!r}")
    pytest.skip(f"cannot import nvidia.dali: {e!r}", allow_module_level=True)

BATCH = 9  # divides the 45 test samples: DALI's reader never yields a partial batch


def _pipelines(daemon: Daemon, dataset: Dataset, decode: bool, batch_format: str = "numpy"):
    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, seed=1)
    def reader():
        jpegs, labels = fn.readers.file(file_root=str(dataset.root), random_shuffle=False, name="r")
        return (fn.decoders.image(jpegs, device="cpu"), labels) if decode else (jpegs, labels)

    src = LoaderSource("train", socket=daemon.socket, batch_size=BATCH, random_shuffle=False,
                       batch_format=batch_format)  # type: ignore[arg-type]

    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, seed=1)
    def external():
        jpegs, labels = fn.external_source(source=src, num_outputs=2, batch=True, no_copy=True,
                                           dtype=[types.UINT8, types.INT32])
        return (fn.decoders.image(jpegs, device="cpu"), labels) if decode else (jpegs, labels)

    return reader(), external(), src


def _outputs(pipe, n: int) -> list[tuple[list[bytes], list[int]]]:
    pipe.build()
    out = []
    for _ in range(n):
        data, labels = pipe.run()
        out.append(([np.array(data[i]).tobytes() + str(np.array(data[i]).shape).encode() for i in range(len(data))],
                    [int(np.array(labels[i]).reshape(-1)[0]) for i in range(len(labels))]))
    return out


@pytest.mark.parametrize("batch_format", ["numpy", "dali"])
@pytest.mark.parametrize("decode", [False, True], ids=["bytes", "decoded"])
def test_external_source_matches_readers_file(daemon: Daemon, dataset: Dataset, decode: bool, batch_format: str) -> None:
    n = len(dataset.files) // BATCH
    ref, ext, src = _pipelines(daemon, dataset, decode, batch_format)
    try:
        want, got = _outputs(ref, n), _outputs(ext, n)
        assert len(src) == n and len(want) == len(got) == n
        assert all(len(d) == BATCH for d, _ in want + got)
        for i, ((wd, wl), (gd, gl)) in enumerate(zip(want, got)):
            assert gl == wl, f"batch {i}: labels differ"
            assert gd == wd, f"batch {i}: {'images' if decode else 'bytes'} differ"
        assert sorted(set(l for _, ls in want for l in ls)) == [0, 1, 2, 3]
        # The epoch ends as DALI expects, and the next one starts after reset.
        with pytest.raises(StopIteration):
            ext.run()
        ext.reset()
        data, labels = ext.run()
        assert [int(np.array(labels[i]).reshape(-1)[0]) for i in range(len(labels))] == want[0][1]
    finally:
        src.close()


def test_dali_batch_format_views_batch_memory(daemon: Daemon, dataset: Dataset) -> None:
    """batch_format="dali", zero_copy=True (read outside DALI): each sample
    of the TensorListCPU lies inside the source's batch memory (no copy)
    and holds its file's bytes and label."""
    from nvidia.dali.backend import TensorListCPU

    with LoaderSource("train", socket=daemon.socket, batch_size=BATCH, random_shuffle=True, seed=3,
                      batch_format="dali", zero_copy=True) as src:
        lo = src._session._buf.ctypes.data
        hi = lo + src._session._buf.size
        seen = 0
        for samples, labels in src:
            assert isinstance(samples, TensorListCPU) and isinstance(labels, TensorListCPU)
            assert len(samples) == len(labels) == BATCH
            lab = labels.as_array().reshape(-1)
            for i in range(len(samples)):
                t = samples[i]
                assert lo <= t.data_ptr() and t.data_ptr() + t.shape()[0] <= hi, f"sample {i} is not a view of batch memory"
                h = hashlib.sha256(np.array(t).tobytes()).hexdigest()
                assert h in dataset.by_hash, f"sample {i}: bytes of no file"
                assert int(lab[i]) == dataset.by_hash[h][1], f"sample {i}: label {lab[i]} is not {dataset.by_hash[h][0]}'s"
                seen += 1
        assert seen == len(dataset.files) // BATCH * BATCH


def test_dali_batch_format_skips_failed_samples(dataset: Dataset, tmp_path: Path) -> None:
    """on_error="skip" with batch_format="dali": the failed sample is left
    out of the TensorListCPU (a smaller batch, never a zero-length
    stand-in), counted and warned about; every other file comes once."""
    root, bmap, by_hash = small_dataset(dataset.root.parent, "dali-skip")
    d = start_daemon(tmp_path, bmap)
    try:
        victim = "c0/10.jpg"
        (root / victim).unlink()
        with LoaderSource("train", socket=d.socket, batch_size=4, on_error="skip", batch_format="dali") as src:
            got = []
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                for samples, labels in src:
                    assert len(samples) == len(labels) > 0
                    got += [hashlib.sha256(np.array(samples[i]).tobytes()).hexdigest() for i in range(len(samples))]
            assert src.skipped_samples == 1
            assert len(w) == 1 and victim in str(w[0].message)
            assert sorted(by_hash[h] for h in got) == sorted(p for p in by_hash.values() if p != victim)
    finally:
        assert stop_daemon(d) == 0
