# SPDX-License-Identifier: Apache-2.0
"""The loop that iterates ``nvfeed.torch.LoaderDataset``: a DataLoader
worker refused (the daemon reads ahead; ``state_dict()`` must see the
loop's position), a DataLoader under a Lightning loop told of (Lightning
cannot checkpoint its position), and the ``device`` argument as a torch
device."""

from __future__ import annotations

import os
import sys
import types
from typing import Optional, Union

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
