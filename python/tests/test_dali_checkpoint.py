# SPDX-License-Identifier: Apache-2.0
"""Real DALI, CPU only: with enable_checkpointing=True and
fn.external_source(source=src.batch, batch_info=True), a pipeline restored
from pipe.checkpoint() with a new LoaderSource continues exactly as the
uninterrupted run, across an epoch boundary, shuffled, on two shards;
restored on other shards it is refused (nvfeed.dali.reader's resume there:
test_dali_reshard.py)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from conftest import Daemon, Dataset
from nvfeed import LoaderError, LoaderSource

try:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def
except Exception as e:  # noqa: BLE001 - any import failure means no DALI here
    pytest.skip(f"cannot import nvidia.dali: {e!r}", allow_module_level=True)

BATCH = 4


def _pipeline(src: LoaderSource, checkpoint: str | None = None):
    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, seed=1, enable_checkpointing=True, prefetch_queue_depth=2)
    def p():
        jpegs, labels = fn.external_source(source=src.batch, num_outputs=2, batch=True, batch_info=True, no_copy=True,
                                           dtype=[types.UINT8, types.INT32])
        return jpegs, labels

    pipe = p(checkpoint=checkpoint)
    pipe.build()
    return pipe


def _steps(pipe, n: int) -> list[str]:
    """n iterations as one string each (hashes and labels); an epoch's end
    (StopIteration, then reset) counts as an iteration named 'EOF'."""
    out = []
    while len(out) < n:
        try:
            data, labels = pipe.run()
        except StopIteration:
            pipe.reset()
            out.append("EOF")
            continue
        out.append(" ".join(f"{hashlib.sha256(np.array(data[i]).tobytes()).hexdigest()[:12]}:{int(np.array(labels[i]).reshape(-1)[0])}"
                            for i in range(len(data))))
    return out


@pytest.mark.parametrize("shard", [0, 1])
def test_checkpoint_restores_exactly(daemon: Daemon, dataset: Dataset, shard: int) -> None:
    kw = dict(socket=daemon.socket, batch_size=BATCH, shard_id=shard, num_shards=2, random_shuffle=True, seed=13)
    with LoaderSource("train", **kw) as src:
        want = _steps(_pipeline(src), 20)
    assert want.count("EOF") >= 2, "the run must cross epoch boundaries"
    for k in (3, 6, 8):  # 6 batches per epoch here: 8 is past the first boundary
        with LoaderSource("train", **kw) as src:
            pipe = _pipeline(src)
            head = _steps(pipe, k)
            cp = pipe.checkpoint()
        with LoaderSource("train", **kw) as src2:
            tail = _steps(_pipeline(src2, checkpoint=cp), 20 - k)
        assert head + tail == want, f"restored after {k} iterations: the sequence differs"


def test_checkpoint_on_other_shards_refused(daemon: Daemon, dataset: Dataset) -> None:
    """DALI asks src.batch for its saved positions, other samples on other
    shards: refused, where nvfeed.dali.reader resumes exactly."""
    kw = dict(socket=daemon.socket, batch_size=BATCH, random_shuffle=True, seed=13)
    with LoaderSource("train", shard_id=0, num_shards=2, **kw) as src:
        pipe = _pipeline(src)
        _steps(pipe, 3)
        cp = pipe.checkpoint()
        with pytest.raises(LoaderError, match="feeds a DALI pipeline"):
            src.state()  # ahead of the loop by DALI's prefetch
        old = type(pipe)._get_checkpoint(pipe)  # DALI's own: as an older nvfeed took it
    with LoaderSource("train", shard_id=0, num_shards=3, **kw) as src2:
        with pytest.raises(Exception, match="num_shards=2 and batch_size=4"):
            _steps(_pipeline(src2, checkpoint=cp), 1)
    with LoaderSource("train", shard_id=0, num_shards=2, **kw) as src3:
        with pytest.warns(RuntimeWarning, match="did not save its state"):
            _steps(_pipeline(src3, checkpoint=old), 1)
