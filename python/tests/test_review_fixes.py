# SPDX-License-Identifier: Apache-2.0
"""Faults found in review, each with the test that shows it fixed (the
datasets of test_resume.py: odd sizes over a real loaderd)."""

from __future__ import annotations

import collections

from test_resume import Sets, sets  # noqa: F401 - the module's fixture
from resume_ranks import KINDS, ids
from nvfeed.torch import LoaderDataset


def test_numpy_padding_only_batch_is_empty(sets: Sets) -> None:  # noqa: F811
    """numpy tensors, pad_last_batch, last_batch_policy="partial": 211
    samples on 3 shards of 70, 70 and 71 in batches of 5. The shards of 70
    read a 15th batch of padding alone, which the loop receives empty
    (it raised IndexError in _views.tensors)."""
    got: collections.Counter[str] = collections.Counter()
    for k in range(3):
        ds = LoaderDataset("tens", socket=sets.daemon.socket, batch_size=5, shard_id=k, num_shards=3,
                           pad_last_batch=True, last_batch_policy="partial", **KINDS["tens"])
        n = 0
        for b in ds:
            got.update(ids("tens", b))
            n += 1
        assert n == len(ds) == 15
    assert got == sets.want["tens"]
