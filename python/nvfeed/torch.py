# SPDX-License-Identifier: Apache-2.0
"""``LoaderDataset``: batches served by loaderd as a PyTorch
``IterableDataset``, for training loops without DALI.

::

    from nvfeed.torch import LoaderDataset   # or: from dali_source.torch import LoaderDataset
    ds = LoaderDataset("imagenet", socket="/run/loaderd/loaderd.sock", batch_size=64,
                       random_shuffle=True, seed=0)
    for epoch in range(epochs):
        for jpegs, labels in ds:             # one epoch of this rank's shard
            images = torchvision.io.decode_jpeg(jpegs, device="cuda")
            ...
        torch.save({"model": ..., "data": ds.state_dict()}, path)

Each item is one batch: a list of 1-D ``torch.uint8`` tensors (one
sample's bytes each, as the file holds them) and an ``int64`` tensor of
labels, shape (batch,). Over a numpy dataset (``mkbmap --reader numpy``)
an item is the arrays alone: one tensor ``(batch, *shape)`` when the
batch's arrays share a shape, else a list of tensors, each its array's
dtype and shape. The dataset batches itself; with a ``DataLoader`` give it
``batch_size=None`` and no workers (under Lightning pass the dataset
itself: see ``LoaderDataset``'s Lightning note).

The pieces behind this module: ``_torchdataset`` (the class, its
session), ``_torchshard`` (the rank, the last-batch policy),
``_torchpasses`` (epochs, positions, set_epoch, state_dict), ``_torchbatch`` (what it
yields: read-only zero-copy tensors, batches that
cannot be mistaken) and ``_torchviews`` (batch memory as tensors).

Needs PyTorch (``pip install nvfeed[torch]``, any torch >= 2.0); the rest
of the client does not.
"""

from __future__ import annotations

from ._torchbatch import DenseBatch, FileBatch, ReadOnlyTensor
from ._torchdataset import STATE_VERSION, Item, LoaderDataset, TorchBatch
from ._torchloop import EpochRepeatWarning
from ._torchpasses import WdsBatch
from ._torchshard import LastBatchPolicy, distributed_shard
from ._torchviews import TensorBatch

__all__ = ["LoaderDataset", "TorchBatch", "TensorBatch", "WdsBatch", "Item", "STATE_VERSION", "distributed_shard",
           "LastBatchPolicy", "ReadOnlyTensor", "DenseBatch", "FileBatch", "EpochRepeatWarning"]
