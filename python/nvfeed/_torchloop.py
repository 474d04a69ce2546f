# SPDX-License-Identifier: Apache-2.0
"""The loop that iterates ``nvfeed.torch.LoaderDataset``: a DataLoader
worker refused (the daemon reads ahead; ``state_dict()`` must see the
loop's position), a DataLoader under a Lightning loop told of (Lightning
cannot checkpoint its position), and the ``device`` argument as a torch
device."""

from __future__ import annotations

import itertools
import os
import sys
import types
from typing import Any, Optional, Union

import torch
import torch.utils.data

DATALOADER_WARNING = (
    "LoaderDataset is iterated through a torch DataLoader, which has no state_dict(): Lightning cannot checkpoint "
    "its position, and a resumed run starts the epoch over. Return the dataset itself from train_dataloader() (it "
    "batches itself) to resume exactly.")
"""The warning for a DataLoader under a Lightning loop."""


def refuse_worker() -> None:
    """Raises ``RuntimeError`` in a DataLoader worker process."""
    info = torch.utils.data.get_worker_info()
    if info is not None:
        raise RuntimeError(
            f"LoaderDataset is being iterated in DataLoader worker {info.id} of {info.num_workers}: use it in the "
            "training process (DataLoader(ds, batch_size=None, num_workers=0), or iterate it directly). The daemon "
            "already reads ahead, and the dataset's state_dict() must see the loop's position.")


def refuse_batching(caller: types.FrameType, dataset: object) -> None:
    """Raises ``TypeError`` when ``caller``, the frame that called ``iter()``
    on ``dataset``, is a torch DataLoader that batches what it yields
    (``batch_size`` not ``None``: 1 by default). Each item is a whole batch
    already: batched again, it would gain a dimension the model takes for
    data."""
    fetcher = caller.f_locals.get("self")
    if getattr(fetcher, "dataset", None) is dataset and getattr(fetcher, "auto_collation", False):
        raise TypeError(
            "LoaderDataset yields whole batches, and this DataLoader would batch them again (its batch_size is "
            "not None; it is 1 by default): make it DataLoader(ds, batch_size=None), or iterate the dataset "
            "itself. With accelerate, hand the dataset to the loop directly rather than through prepare().")


def dataloader_under_lightning(caller: types.FrameType) -> bool:
    """Whether ``caller``, the frame that called ``iter()`` on the dataset,
    is a torch DataLoader's fetch with a Lightning loop on the stack above
    it (not merely Lightning imported: a plain loop in a process that
    imported Lightning is not warned)."""
    if "lightning" not in sys.modules and "pytorch_lightning" not in sys.modules:
        return False
    if os.path.join("data", "_utils", "fetch.py") not in caller.f_code.co_filename:
        return False
    marks = (os.path.join("lightning", "pytorch", ""), os.path.join("pytorch_lightning", ""))
    f: Optional[types.FrameType] = caller
    while f is not None:
        if any(m in f.f_code.co_filename for m in marks):
            return True
        f = f.f_back
    return False


class EpochRepeatWarning(UserWarning):
    """A new ``LoaderDataset`` begins an epoch 0 that another dataset of
    the process, with the same sampling, already began: made anew each
    epoch without ``set_epoch``, it would repeat that order. Filter it
    where datasets are made again on purpose (a notebook's rerun)."""


class EpochHook:
    """A dataset's ``set_epoch`` where Lightning looks for it: on a
    loader's ``sampler``."""

    def __init__(self, dataset: Any) -> None:
        self._dataset = dataset

    def set_epoch(self, epoch: int) -> None:
        """The dataset's ``set_epoch(epoch)``."""
        self._dataset.set_epoch(epoch)


_EPOCH_ZERO: dict[tuple[Any, ...], int] = {}  # a sampling's key: the dataset that began its epoch 0
_TOKENS = itertools.count()


def epoch_zero_again(dataset: Any, key: tuple[Any, ...]) -> bool:
    """Whether a dataset other than ``dataset`` already began epoch 0 of
    the sampling ``key`` in this process (told once per key)."""
    token = dataset.__dict__.setdefault("_epoch_zero_token", next(_TOKENS))
    first = _EPOCH_ZERO.setdefault(key, token)
    if first in (token, -1):
        return False
    _EPOCH_ZERO[key] = -1
    return True


def torch_device(device: Union[str, torch.device]) -> torch.device:
    """``device`` as a CPU or CUDA device, a CUDA one with its index (the
    current device's when it names none).

    Raises
    ------
    ValueError
        ``device`` is not a CPU or CUDA device.
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}: {e}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return dev
