# SPDX-License-Identifier: Apache-2.0
"""One rank of test_torch.py's two-rank run, under torchrun (gloo): a DDP
training loop on LoaderDataset (shard from torch.distributed), then a run
cut after K steps and resumed from rank 0's state_dict(). Writes
OUT/rank{R}.json: what each epoch held, how many kept tensors changed,
and both step sequences.

    torchrun --standalone --nproc_per_node 2 torch_ranks.py SOCKET OUT BATCH EPOCHS K
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchvision.io import decode_jpeg

from nvfeed.torch import LoaderDataset, TorchBatch


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, jpegs: list[torch.Tensor], labels: torch.Tensor) -> None:
    x = torch.stack([F.interpolate(im.unsqueeze(0).float(), size=(16, 16), mode="bilinear", align_corners=False)[0]
                     for im in decode_jpeg(jpegs)]) / 255.0
    loss = F.cross_entropy(model(x), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()


def batches(ds: LoaderDataset) -> Iterator[TorchBatch]:
    """The dataset's batches, epoch after epoch."""
    while True:
        yield from ds


def main() -> None:
    socket, out, batch, epochs, k = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # Shards of 22 and 23 samples: as many batches on both ranks, no padding.
    kw = dict(socket=socket, batch_size=batch, random_shuffle=True, seed=5)

    ds = LoaderDataset("train", **kw)  # type: ignore[arg-type]
    kept: list[tuple[torch.Tensor, str]] = []
    per_epoch, steps = [], []
    for _ in range(epochs):
        seen = []
        for jpegs, labels in torch.utils.data.DataLoader(ds, batch_size=None):
            step(model, opt, jpegs, labels)
            hs = [digest(t) for t in jpegs]
            kept += zip(jpegs, hs)
            seen += [f"{h}:{int(lbl)}" for h, lbl in zip(hs, labels)]
            steps.append(" ".join(hs))
        per_epoch.append(seen)
    changed = sum(digest(t) != h for t, h in kept)
    shard = ds.shard
    ds.close()

    # Cut after k steps; rank 0's state_dict() resumes every rank.
    first = LoaderDataset("train", **kw)  # type: ignore[arg-type]
    resumed: list[str] = []
    it = batches(first)
    for _ in range(k):
        resumed.append(" ".join(digest(t) for t in next(it)[0]))
    sd = [first.state_dict() if rank == 0 else None]
    dist.broadcast_object_list(sd, src=0)
    first.close()
    second = LoaderDataset("train", **kw)  # type: ignore[arg-type]
    second.load_state_dict(sd[0])  # type: ignore[arg-type]
    it = batches(second)
    while len(resumed) < len(steps):
        resumed.append(" ".join(digest(t) for t in next(it)[0]))
    second.close()
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"shard": shard, "epochs": per_epoch, "kept": len(kept), "changed": changed,
                   "steps": steps, "resumed": resumed}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
