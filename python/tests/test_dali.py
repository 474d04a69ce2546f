"""Real DALI, CPU only: fn.readers.file and fn.external_source(LoaderSource)
yield the same bytes, labels and decoded images for a whole epoch."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import Daemon, Dataset
from dali_source import LoaderSource

try:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def
except Exception as e:  # noqa: BLE001 - any import failure means no DALI here
    print(f"DALI tests skip: cannot import nvidia.dali: {e!r}")
    pytest.skip(f"cannot import nvidia.dali: {e!r}", allow_module_level=True)

BATCH = 9  # divides the 45 test samples: DALI's reader never yields a partial batch


def _pipelines(daemon: Daemon, dataset: Dataset, decode: bool):
    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, seed=1)
    def reader():
        jpegs, labels = fn.readers.file(file_root=str(dataset.root), random_shuffle=False, name="r")
        return (fn.decoders.image(jpegs, device="cpu"), labels) if decode else (jpegs, labels)

    src = LoaderSource("train", socket=daemon.socket, batch_size=BATCH, random_shuffle=False)

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


@pytest.mark.parametrize("decode", [False, True], ids=["bytes", "decoded"])
def test_external_source_matches_readers_file(daemon: Daemon, dataset: Dataset, decode: bool) -> None:
    n = len(dataset.files) // BATCH
    ref, ext, src = _pipelines(daemon, dataset, decode)
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
