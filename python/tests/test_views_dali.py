# SPDX-License-Identifier: Apache-2.0
"""Batches handed to DALI as TensorListCPU: each sample a view of the
batch memory at its offset, bytes and lengths exact (empty ones too),
the memory kept alive by the list."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

pytest.importorskip("nvidia.dali")

from nvfeed import _views, _wds  # noqa: E402
from nvfeed._views import DaliTypes, Mapped  # noqa: E402


def _memory() -> tuple[mmap.mmap, Mapped]:
    mm = mmap.mmap(-1, 4096)
    mm[:64] = bytes(range(64))
    buf = np.frombuffer(mm, dtype=np.uint8)
    return mm, Mapped(mm, buf, None, DaliTypes())


def test_a_file_batch_is_views_of_its_samples() -> None:
    mm, m = _memory()
    samples, labels = _views.batch(m, [0, 10, 40], [5, 0, 3], np.array([[7], [8], [9]], dtype=np.int32))
    assert [np.array(samples.at(i)).tobytes() for i in range(len(samples))] == [bytes(range(5)), b"",
                                                                                bytes(range(40, 43))]
    assert str(samples.dtype) == "DALIDataType.UINT8"
    assert [np.array(labels.at(i)).tolist() for i in range(3)] == [[7], [8], [9]]
    mm[0] = 99  # a view, not a copy
    assert np.array(samples.at(0))[0] == 99


def test_the_list_keeps_the_memory_alive() -> None:
    mm, m = _memory()
    samples, _ = _views.batch(m, [1], [4], np.array([[0]], dtype=np.int32))
    del m
    with pytest.raises(BufferError):
        mm.close()  # a sample still views it
    del samples
    mm.close()


def test_webdataset_components_with_an_empty_one() -> None:
    _, m = _memory()
    # Two samples of two components; sample 1's second is empty (offset 0).
    jpg, cls = _wds.outputs(m, 2, [0, 8, 16, 0], [4, 2, 3, 0], None)
    assert [np.array(jpg.at(i)).tobytes() for i in range(2)] == [bytes(range(4)), bytes(range(16, 19))]
    assert [np.array(cls.at(i)).tobytes() for i in range(2)] == [bytes(range(8, 10)), b""]
    kept, = _wds.outputs(m, 1, [0, 8, 16], [1, 1, 1], [0, 2])
    assert [np.array(kept.at(i)).tobytes() for i in range(2)] == [b"\x00", b"\x10"]
