# SPDX-License-Identifier: Apache-2.0
"""One Lightning run of test_lightning.py: a tiny model trained (CPU,
1 rank, or 2-rank DDP over gloo) on LoaderDataset for 3 epochs with
validation and its sanity check, a checkpoint after every step; with
CRASH > 0 the run raises in training_step at that global step, and with
RESUME it goes on from OUT/ck/last.ckpt; with RELOAD Lightning makes
the datasets anew every epoch (reload_dataloaders_every_n_epochs=1); LIMIT
is limit_train_batches (default 1.0). Every sample each step saw is
appended to OUT/rank{R}.jsonl as it happens (a crash loses none).

    python lightning_run.py SOCKET OUT DEVICES CRASH RESUME [RELOAD [LIMIT]]
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F

from nvfeed.torch import LoaderDataset

BATCH = 4


class Net(L.LightningModule):
    def __init__(self, socket: str, out: str, crash: int, tag: str) -> None:
        super().__init__()
        self.socket, self.out, self.crash, self.tag = socket, out, crash, tag
        self.lin = torch.nn.Linear(16, 4)

    def record(self, phase: str, batch_idx: int, samples: list[torch.Tensor]) -> None:
        ids = [hashlib.sha256(s.numpy().tobytes()).hexdigest()[:16] for s in samples]
        with open(os.path.join(self.out, f"rank{self.global_rank}.jsonl"), "a") as f:
            f.write(json.dumps({"run": self.tag, "phase": phase, "epoch": self.current_epoch, "batch": batch_idx,
                                "ids": ids}) + "\n")

    def step(self, batch: Any) -> torch.Tensor:
        samples, labels = batch
        x = torch.stack([s[:16].float() / 255 for s in samples])
        return F.cross_entropy(self.lin(x), labels)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.crash and self.global_step == self.crash:
            raise RuntimeError(f"crash at step {self.crash}")
        self.record("train", batch_idx, batch[0])
        return self.step(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.record("sanity" if self.trainer.sanity_checking else "val", batch_idx, batch[0])
        self.step(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> LoaderDataset:
        return LoaderDataset("train", socket=self.socket, batch_size=BATCH, random_shuffle=True, seed=7)

    def val_dataloader(self) -> LoaderDataset:
        return LoaderDataset("train", socket=self.socket, batch_size=BATCH)


def main() -> None:
    socket, out, devices, crash, resume = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
    reload = len(sys.argv) > 6 and sys.argv[6] == "1"
    limit = float(sys.argv[7]) if len(sys.argv) > 7 else 1.0
    torch.manual_seed(0)
    ck = L.pytorch.callbacks.ModelCheckpoint(dirpath=os.path.join(out, "ck"), every_n_train_steps=1, save_last=True,
                                             save_top_k=0)
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto", max_epochs=3,
                        num_sanity_val_steps=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[ck], use_distributed_sampler=False, reload_dataloaders_every_n_epochs=int(reload),
                        limit_train_batches=limit)
    net = Net(socket, out, crash, "resumed" if resume else "first")
    trainer.fit(net, ckpt_path=os.path.join(out, "ck", "last.ckpt") if resume else None)


if __name__ == "__main__":
    main()
