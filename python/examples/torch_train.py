# SPDX-License-Identifier: Apache-2.0
"""Trains a torchvision ResNet-18 on JPEGs served by loaderd, with PyTorch
alone (no DALI): nvfeed.torch.LoaderDataset gives each rank its shard as
batches of JPEG bytes, torchvision decodes them.

    # CPU, one process
    python torch_train.py --socket /run/loaderd/loaderd.sock --dataset train --epochs 2
    # CPU, two ranks (gloo): each takes its shard from torch.distributed
    torchrun --standalone --nproc_per_node 2 torch_train.py --dataset train --epochs 2
    # GPU: decode_jpeg(device="cuda") decodes each batch with nvJPEG (nccl with several ranks)
    torchrun --standalone --nproc_per_node 8 torch_train.py --dataset imagenet --device cuda --size 224

--checkpoint PATH saves the model, the optimizer and the dataset's
state_dict() (rank 0, every --save-every steps and at each epoch's end) and
resumes from PATH when it exists: the run goes on with exactly the batch
it would have trained next. The GPU variant is written for a machine with
CUDA and has not been run where this example is tested (CPU only).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torchvision.io import decode_jpeg

from nvfeed import datasets
from nvfeed.torch import LoaderDataset


def images(jpegs: list[torch.Tensor], size: int, device: torch.device) -> torch.Tensor:
    """A float batch (N, 3, size, size) from JPEG bytes: decoded on the CPU,
    or with nvJPEG on the GPU (decode_jpeg takes the bytes on the CPU either
    way), then resized and scaled to [0, 1]."""
    decoded = decode_jpeg(jpegs, mode=torchvision.io.ImageReadMode.RGB, device=device)
    return torch.stack([F.interpolate(im.unsqueeze(0).float(), size=(size, size), mode="bilinear",
                                      align_corners=False)[0] for im in decoded]) / 255.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--socket", default=None, help="loaderd's socket (default: $NVFEED_SOCKET, else /run/loaderd/loaderd.sock)")
    p.add_argument("--dataset", default="train")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--size", type=int, default=64, help="image side after resizing")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--device", default="cpu", help="cpu, or cuda (decode and train on the GPU)")
    p.add_argument("--checkpoint", default=None, help="save here, and resume from here when it exists")
    p.add_argument("--save-every", type=int, default=0, help="also save every N steps (0: at epochs' ends only)")
    a = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = a.device.startswith("cuda")
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank() if world > 1 else 0
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)

    classes = next(d["classes"] for d in datasets(a.socket) if d["name"] == a.dataset)
    # The shard comes from torch.distributed; pad_last_batch gives every rank
    # as many batches, so that no rank waits on a finished one.
    ds = LoaderDataset(a.dataset, socket=a.socket, batch_size=a.batch_size, random_shuffle=True, seed=42,
                       pad_last_batch=world > 1)
    model: torch.nn.Module = torchvision.models.resnet18(num_classes=classes).to(device)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    step = 0
    if a.checkpoint and os.path.exists(a.checkpoint):
        ck = torch.load(a.checkpoint, map_location=device, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        ds.load_state_dict(ck["data"])  # rank 0's position; each rank keeps its shard
        step = ck["step"]
        if rank == 0:
            print(f"resumed at step {step}: epoch {ck['data']['epoch']} batch {ck['data']['batch']}", flush=True)

    def save() -> None:
        if a.checkpoint and rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "data": ds.state_dict(),
                        "step": step}, a.checkpoint)

    start_epoch = ds.state_dict()["epoch"]
    for epoch in range(start_epoch, a.epochs):
        model.train()
        seen, total, t0 = 0, 0.0, time.perf_counter()
        for jpegs, labels in ds:  # this rank's shard, one epoch
            x = images(jpegs, a.size, device)
            loss = F.cross_entropy(model(x), labels.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            seen += len(jpegs)
            total += loss.item() * len(jpegs)
            if a.save_every and step % a.save_every == 0:
                save()
        save()
        dt = time.perf_counter() - t0
        print(f"rank {rank} epoch {epoch}: {seen} samples, loss {total / max(seen, 1):.4f}, "
              f"{seen / dt:.1f} img/s", flush=True)
    ds.close()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
