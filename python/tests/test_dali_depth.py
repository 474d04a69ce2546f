# SPDX-License-Identifier: Apache-2.0
"""release_after under real DALI: derived from the pipeline's queue depths
(an int, or separated cpu_size/gpu_size), so that no batch is given back to
the daemon (and overwritten) while DALI may still read it in place
(fn.external_source(no_copy=True)); a release_after given that is too small
is an error naming both. Every output is compared with the files after the
run."""

from __future__ import annotations

import hashlib
import re
from typing import Any, Callable

import numpy as np
import pytest

from conftest import Daemon, Dataset
from nvfeed import LoaderSource

try:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def
except Exception as e:  # noqa: BLE001 - any import failure means no DALI here
    print(f"DALI tests skip: cannot import nvidia.dali: {e!r}")
    pytest.skip(f"cannot import nvidia.dali: {e!r}", allow_module_level=True)

BATCH = 2  # 22 batches and a partial one per epoch of the 45 test samples
KW: dict[str, Any] = dict(batch_size=BATCH, random_shuffle=True, seed=3)


def _expected(daemon: Daemon, dataset: Dataset, epochs: int) -> list[list[str]]:
    """The files of each batch, in order, epoch after epoch: a source read
    without DALI, each sample hashed when it comes (then looked up)."""
    out = []
    with LoaderSource("train", socket=daemon.socket, **KW) as src:
        for _ in range(epochs):
            for samples, _ in src:
                out.append([dataset.by_hash[hashlib.sha256(s.tobytes()).hexdigest()][0] for s in samples])
    return out


def _pipe(src: Any, depth: Any, decode: bool, batch_info: bool = False) -> Any:
    sep = isinstance(depth, dict)

    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, seed=1, prefetch_queue_depth=depth,
                  **({"exec_dynamic": False} if sep else {}))
    def p():  # type: ignore[no-untyped-def]
        source: Callable[..., Any] = src.batch if batch_info else src
        jpegs, labels = fn.external_source(source=source, num_outputs=2, batch=True, no_copy=True, batch_info=batch_info,
                                           dtype=[types.UINT8, types.INT32])
        if decode:  # the decoder reads the source's memory in place
            return jpegs, fn.decoders.image(jpegs, device="cpu"), labels
        return jpegs, labels

    pipe = p()
    pipe.build()
    return pipe


def _run(pipe: Any, epochs: int) -> list[list[bytes]]:
    """Every batch of the epochs, each sample's bytes copied when run()
    returns it."""
    out = []
    for e in range(epochs):
        if e:
            pipe.reset()
        while True:
            try:
                jpegs = pipe.run()[0]
            except StopIteration:
                break
            out.append([np.array(jpegs[i]).tobytes() for i in range(len(jpegs))])
    return out


@pytest.mark.parametrize("depth, need", [
    (8, 9),
    ({"cpu_size": 2, "gpu_size": 8}, 17),
    ({"cpu_size": 8, "gpu_size": 8}, 9),
], ids=["8", "cpu2-gpu8", "cpu8-gpu8"])
@pytest.mark.parametrize("decode", [False, True], ids=["bytes", "decoded"])
def test_release_after_derived_from_the_pipeline(daemon: Daemon, dataset: Dataset, depth: Any, need: int, decode: bool) -> None:
    """At depth 8 (and separated queues) the source's release_after is
    derived from the pipeline when DALI builds it; two epochs through the
    pipeline (with a decoder reading the source's memory) then equal the
    files, batch for batch. With the daemon's default instead (3), 12 to 37
    of the 46 batches came out with other samples' bytes, and the decoder
    failed on bytes overwritten under it."""
    want = _expected(daemon, dataset, 2)
    with LoaderSource("train", socket=daemon.socket, **KW) as src:
        assert src._session.release_after == 3  # the daemon's default: prefetch_queue_depth 2 + 1
        pipe = _pipe(src, depth, decode)
        got = _run(pipe, 2)
        in_effect = src._session.release_after
        del pipe
    assert len(got) == len(want) == 2 * 23
    wrong = [i for i, (g, w) in enumerate(zip(got, want)) if g != [(dataset.root / p).read_bytes() for p in w]]
    assert not wrong, f"{len(wrong)} of {len(got)} batches are not their files' bytes (release_after {in_effect})"
    assert in_effect == need


def test_release_after_derived_for_batch_info(daemon: Daemon, dataset: Dataset) -> None:
    """src.batch (a callable: DALI never calls iter() on it) finds the
    pipeline at its first call, before it has handed out a batch."""
    want = _expected(daemon, dataset, 1)
    with LoaderSource("train", socket=daemon.socket, **KW) as src:
        pipe = _pipe(src, 8, decode=True, batch_info=True)
        got = _run(pipe, 1)
        assert src._session.release_after == 9
        del pipe
    assert got == [[(dataset.root / p).read_bytes() for p in w] for w in want]


def test_release_after_given_is_checked(daemon: Daemon) -> None:
    """A release_after given that DALI's depths outrun is a ValueError naming
    both, when DALI builds the pipeline; one large enough is kept."""
    with LoaderSource("train", socket=daemon.socket, release_after=3, **KW) as src:
        with pytest.raises(ValueError, match=re.escape("release_after=3 is too small: the DALI pipeline's prefetch_queue_depth=8 "
                                                       "may still read a batch 8 batches after it was fed")):
            _pipe(src, 8, decode=False)
    with LoaderSource("train", socket=daemon.socket, release_after=3, **KW) as src:
        with pytest.raises(ValueError, match=re.escape("pass release_after >= 17")):
            _pipe(src, {"cpu_size": 2, "gpu_size": 8}, decode=False)
    with LoaderSource("train", socket=daemon.socket, release_after=12, **KW) as src:
        _pipe(src, 8, decode=False).run()
        assert src._session.release_after == 12


def test_depths_past_the_daemons_limit(daemon: Daemon) -> None:
    with LoaderSource("train", socket=daemon.socket, **KW) as src:
        with pytest.raises(ValueError, match=re.escape("the DALI pipeline's prefetch_queue_depth={'cpu_size': 4, 'gpu_size': 16} "
                                                       "may still read a batch 64 batches after it was fed")
                           + ".*" + re.escape("would need release_after >= 65, past its range [0, 64]")):
            _pipe(src, {"cpu_size": 4, "gpu_size": 16}, decode=False)


def test_without_dali_release_after_is_the_daemons(daemon: Daemon) -> None:
    with LoaderSource("train", socket=daemon.socket, **KW) as src:
        for _ in src:
            pass
        assert src._session.release_after == 3
