# SPDX-License-Identifier: Apache-2.0
"""Errors that say where a value came from and what to do, followed as a
user would.

- DALI's ResNet-50 example
  (docs/examples/use_cases/pytorch/resnet50/main.py) sizes its epoch from
  the iterator (``train_loader_len = ceil(train_loader._size /
  batch_size)``) and divides by it (``adjust_learning_rate``'s warmup):
  with ``reader_name``, the reader padded or not, or with ``size=`` and
  ``last_batch_padded=True``, the swap trains every sample once an epoch,
  as ``fn.readers.file`` does.
- A rank mismatch over seeds the user never passed says they were
  derived from the pipeline's seed, and how to fix it; the fix works.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import pytest

from conftest import Daemon, Dataset
from nvfeed import RankMismatchError

dali = pytest.importorskip("nvidia.dali")
pytorch_plugin = pytest.importorskip("nvidia.dali.plugin.pytorch")
from nvidia.dali.plugin.base_iterator import LastBatchPolicy  # noqa: E402

import nvfeed.dali  # noqa: E402

BATCH = 8


def _pipe(socket: str, pad: bool, pipe_seed: Optional[int] = None, **kw: Any) -> Any:
    @dali.pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, seed=pipe_seed)
    def p() -> Any:
        jpegs, labels = nvfeed.dali.reader("train", socket=socket, pad_last_batch=pad, name="Reader", **kw)
        return dali.fn.shapes(jpegs), labels  # the example decodes; a tensor of one shape will do here
    pipe = p()
    pipe.build()
    return pipe


def _resnet50_epoch(loader: Any) -> int:
    """DALI's ResNet-50 example's train loop, what it computes of the
    loader: its length and the warmup's learning rate; the samples."""
    seen = 0
    for i, data in enumerate(loader):
        train_loader_len = int(math.ceil(loader._size / BATCH))
        lr = 0.1 * float(1 + i + 0 * train_loader_len) / (5. * train_loader_len)  # adjust_learning_rate, epoch 0
        assert lr > 0
        seen += data[0]["label"].shape[0]
    return seen


def test_reader_name_with_or_without_padding(daemon: Daemon, dataset: Dataset) -> None:
    """DALI's ResNet-50 example's loop over the swap, the iterator given
    reader_name, the reader padded or not (DALI's readers go on into the
    next epoch; the iterator trims the batch that crosses into it), or
    given size= over a padded reader: every sample once an epoch."""
    n = len(dataset.files)
    assert n % BATCH, "the dataset must end with a partial batch"
    for pad in (False, True):
        named = pytorch_plugin.DALIClassificationIterator(_pipe(daemon.socket, pad=pad), reader_name="Reader",
                                                          last_batch_policy=LastBatchPolicy.PARTIAL)
        assert [_resnet50_epoch(named) for _ in range(2)] == [n, n]
    sized = pytorch_plugin.DALIClassificationIterator(_pipe(daemon.socket, pad=True), size=n, last_batch_padded=True,
                                                      last_batch_policy=LastBatchPolicy.PARTIAL)
    assert _resnet50_epoch(sized) == n


def test_derived_seed_mismatch_says_so(daemon: Daemon) -> None:
    """Two ranks of a job (job_id: the daemon compares them) whose
    readers take their seed from their pipelines (12 + rank, as DALI's
    examples seed them) with the one shuffle whose seed every rank must
    share: the refusal names the derived seed and the fix; the fix opens."""
    kw: dict[str, Any] = dict(num_shards=2, random_shuffle=True, shuffle="permute", job_id="advice")
    rank0 = _pipe(daemon.socket, True, 12, shard_id=0, **kw)
    rank0.run()
    rank1 = _pipe(daemon.socket, True, 13, shard_id=1, **kw)
    with pytest.raises(Exception) as refused:
        rank1.run()
    err: Optional[BaseException] = refused.value
    while err is not None and not isinstance(err, RankMismatchError):  # DALI may wrap the callback's error
        err = err.__cause__ or err.__context__
    msg = str(err if err is not None else refused.value)
    assert "derived it from the pipeline's seed (seed=13)" in msg, msg
    assert "Pass the same seed= to nvfeed.dali.reader on every rank" in msg, msg
    # The fix: the same seed= on both ranks (another job: the first keeps its session).
    kw["job_id"] = "advice-fixed"
    for r in range(2):
        _pipe(daemon.socket, True, 12 + r, shard_id=r, seed=99, **kw).run()
