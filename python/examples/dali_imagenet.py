# SPDX-License-Identifier: Apache-2.0
"""The structure of DALI's PyTorch ImageNet example
(docs/examples/use_cases/pytorch/resnet50/main.py in NVIDIA/DALI), cut to
its data path and written for this project: the pipeline (a file reader
with pad_last_batch and name="Reader", random-crop decoding, resize, coin
flip, crop-mirror-normalize; the seed 12 + local rank), DALIClassification-
Iterator with reader_name="Reader" and LastBatchPolicy.PARTIAL, the train
loop that sizes its learning-rate warm-up with ``train_loader._size``, the
validation loop, and ``reset()`` of both iterators after every epoch. CPU
decoding, a small model, gloo under torchrun.

``--reader file`` reads with ``fn.readers.file``; ``--reader nvfeed`` with
the one-line swap, ``nvfeed.dali.reader``, the datasets given by their
loaderd names (the socket: ``$NVFEED_SOCKET``). Nothing else changes.

::

    python dali_imagenet.py --reader file /data/train /data/val
    NVFEED_SOCKET=/run/loaderd/loaderd.sock python dali_imagenet.py --reader nvfeed train val
    torchrun --nproc_per_node 2 dali_imagenet.py --reader nvfeed train val

``--dump DIR`` writes, per rank, what the run saw and learned (every
batch's labels and a digest of its images, the losses, the final weights'
digest) to DIR/rank<R>.json: two runs are the same run when the files are
equal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali.plugin.pytorch import DALIClassificationIterator, LastBatchPolicy

import nvfeed.dali


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="DALI's ImageNet example's data path, with fn.readers.file or nvfeed")
    p.add_argument("data", nargs=2, metavar=("TRAIN", "VAL"),
                   help="directories (--reader file) or loaderd dataset names (--reader nvfeed)")
    p.add_argument("--reader", choices=["file", "nvfeed"], default="file")
    p.add_argument("--arch", default="tiny", help="'tiny' (a small CNN) or a torchvision model name")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("-j", "--workers", type=int, default=2, help="DALI threads")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("-b", "--batch-size", type=int, default=256, help="per process")
    p.add_argument("--lr", type=float, default=0.1, help="scaled by the global batch size / 256")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--val-size", type=int, default=256)
    p.add_argument("--print-freq", "-p", type=int, default=10)
    p.add_argument("--local_rank", "--local-rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    p.add_argument("--dump", type=Path, help="write what each rank saw and learned to DIR/rank<R>.json")
    return p.parse_args()


@pipeline_def
def create_dali_pipeline(data_dir: str, crop: int, size: int, shard_id: int, num_shards: int, reader: str,
                         is_training: bool = True):
    if reader == "nvfeed":  # the swap: this line, the dataset's loaderd name in place of its directory
        images, labels = nvfeed.dali.reader(data_dir, shard_id=shard_id, num_shards=num_shards,
                                            random_shuffle=is_training, pad_last_batch=True, name="Reader")
    else:
        images, labels = fn.readers.file(file_root=data_dir, shard_id=shard_id, num_shards=num_shards,
                                         random_shuffle=is_training, pad_last_batch=True, name="Reader")
    if is_training:
        images = fn.decoders.image_random_crop(images, device="cpu", output_type=types.RGB,
                                               random_aspect_ratio=[0.8, 1.25], random_area=[0.1, 1.0],
                                               num_attempts=100)
        images = fn.resize(images, resize_x=crop, resize_y=crop, interp_type=types.INTERP_TRIANGULAR)
        mirror = fn.random.coin_flip(probability=0.5)
    else:
        images = fn.decoders.image(images, device="cpu", output_type=types.RGB)
        images = fn.resize(images, size=size, mode="not_smaller", interp_type=types.INTERP_TRIANGULAR)
        mirror = False
    images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", crop=(crop, crop),
                                      mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
                                      std=[0.229 * 255, 0.224 * 255, 0.225 * 255], mirror=mirror)
    return images, labels


def tiny(classes: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))


class Record:
    """What a rank saw and learned, for --dump."""

    def __init__(self) -> None:
        self.train: list[Any] = []
        self.val: list[Any] = []
        self.loss: list[float] = []

    @staticmethod
    def batch(epoch: int, i: int, data: torch.Tensor, target: torch.Tensor) -> list[Any]:
        return [epoch, i, hashlib.sha256(data.contiguous().numpy().tobytes()).hexdigest()[:16], target.tolist()]


def main() -> None:
    global args
    args = parse()
    torch.manual_seed(0)  # the same initial weights for either reader
    torch.set_num_threads(1)
    args.distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
    args.world_size = 1
    if args.distributed:
        dist.init_process_group(backend="gloo", init_method="env://")
        args.world_size = dist.get_world_size()
    args.total_batch_size = args.world_size * args.batch_size

    model: nn.Module = tiny(args.classes) if args.arch == "tiny" else __import__("torchvision").models.__dict__[args.arch](
        num_classes=args.classes)
    args.lr = args.lr * float(args.batch_size * args.world_size) / 256.
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    if args.distributed:
        model = nn.parallel.DistributedDataParallel(model)
    criterion = nn.CrossEntropyLoss()

    traindir, valdir = args.data
    common = dict(batch_size=args.batch_size, num_threads=args.workers, device_id=None, seed=12 + args.local_rank,
                  crop=args.crop, size=args.val_size, shard_id=args.local_rank, num_shards=args.world_size,
                  reader=args.reader)
    pipe = create_dali_pipeline(data_dir=traindir, is_training=True, **common)
    pipe.build()
    train_loader = DALIClassificationIterator(pipe, reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL)
    pipe = create_dali_pipeline(data_dir=valdir, is_training=False, **common)
    pipe.build()
    val_loader = DALIClassificationIterator(pipe, reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL)

    rec = Record()
    for epoch in range(args.epochs):
        train(train_loader, model, criterion, optimizer, epoch, rec)
        prec1, prec5 = validate(val_loader, model, criterion, epoch, rec)
        train_loader.reset()
        val_loader.reset()
    if args.dump:
        args.dump.mkdir(parents=True, exist_ok=True)
        weights = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
        rank = dist.get_rank() if args.distributed else 0
        (args.dump / f"rank{rank}.json").write_text(json.dumps(
            {"train": rec.train, "val": rec.val, "loss": rec.loss, "weights": weights,
             "train_size": train_loader._size, "val_size": val_loader._size}))
    if args.distributed:
        dist.destroy_process_group()


def train(train_loader, model, criterion, optimizer, epoch: int, rec: Record) -> float:
    batch_time, losses, top1, top5 = AverageMeter(), AverageMeter(), AverageMeter(), AverageMeter()
    model.train()
    end = time.time()
    for i, data in enumerate(train_loader):
        input = data[0]["data"]
        target = data[0]["label"].squeeze(-1).long()
        train_loader_len = int(math.ceil(train_loader._size / args.batch_size))  # the epoch in batches, from the iterator
        adjust_learning_rate(optimizer, epoch, i, train_loader_len)
        rec.train.append(Record.batch(epoch, i, input, target))
        output = model(input)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        rec.loss.append(loss.item())
        if i % args.print_freq == 0:
            prec1, prec5 = accuracy(output.data, target, topk=(1, 5))
            if args.distributed:
                reduced_loss, prec1, prec5 = reduce_tensor(loss.data), reduce_tensor(prec1), reduce_tensor(prec5)
            else:
                reduced_loss = loss.data
            losses.update(reduced_loss.item(), input.size(0))
            top1.update(prec1.item(), input.size(0))
            top5.update(prec5.item(), input.size(0))
            batch_time.update((time.time() - end) / args.print_freq)
            end = time.time()
            if args.local_rank == 0:
                print(f"Epoch: [{epoch}][{i}/{train_loader_len}]\tLoss {losses.val:.4f} ({losses.avg:.4f})\t"
                      f"Prec@1 {top1.val:.3f} ({top1.avg:.3f})\tPrec@5 {top5.val:.3f} ({top5.avg:.3f})", flush=True)
    return batch_time.avg


def validate(val_loader, model, criterion, epoch: int, rec: Record) -> list[float]:
    losses, top1, top5 = AverageMeter(), AverageMeter(), AverageMeter()
    model.eval()
    for i, data in enumerate(val_loader):
        input = data[0]["data"]
        target = data[0]["label"].squeeze(-1).long()
        val_loader_len = int(val_loader._size / args.batch_size)
        rec.val.append(Record.batch(epoch, i, input, target))
        with torch.no_grad():
            output = model(input)
            loss = criterion(output, target)
        prec1, prec5 = accuracy(output.data, target, topk=(1, 5))
        if args.distributed:
            reduced_loss, prec1, prec5 = reduce_tensor(loss.data), reduce_tensor(prec1), reduce_tensor(prec5)
        else:
            reduced_loss = loss.data
        losses.update(reduced_loss.item(), input.size(0))
        top1.update(prec1.item(), input.size(0))
        top5.update(prec5.item(), input.size(0))
        if args.local_rank == 0 and i % args.print_freq == 0:
            print(f"Test: [{i}/{val_loader_len}]\tLoss {losses.val:.4f} ({losses.avg:.4f})\t"
                  f"Prec@1 {top1.val:.3f} ({top1.avg:.3f})", flush=True)
    if args.local_rank == 0:
        print(f" * Prec@1 {top1.avg:.3f} Prec@5 {top5.avg:.3f}", flush=True)
    return [top1.avg, top5.avg]


class AverageMeter:
    def __init__(self) -> None:
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def adjust_learning_rate(optimizer, epoch: int, step: int, len_epoch: int) -> None:
    """DALI's example's schedule: a step decay, and a linear warm-up over
    the first 5 epochs, which divides by the epoch's length in batches."""
    lr = args.lr * (0.1 ** (epoch // 30 + (epoch >= 80)))
    if epoch < 5:
        lr = lr * float(1 + step + epoch * len_epoch) / (5. * len_epoch)
    for group in optimizer.param_groups:
        group["lr"] = lr


def accuracy(output: torch.Tensor, target: torch.Tensor, topk: tuple[int, ...] = (1,)) -> list[torch.Tensor]:
    maxk = max(topk)
    batch_size = target.size(0)
    _, pred = output.topk(maxk, 1, True, True)
    correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
    return [correct[:k].reshape(-1).float().sum(0, keepdim=True).mul_(100.0 / batch_size) for k in topk]


def reduce_tensor(tensor: torch.Tensor) -> torch.Tensor:
    rt = tensor.clone()
    dist.all_reduce(rt, op=dist.ReduceOp.SUM)
    return rt / args.world_size


if __name__ == "__main__":
    main()
