# SPDX-License-Identifier: Apache-2.0
"""One Lightning run of test_idle.py: a tiny model trained one epoch on
LoaderDataset, then validated, without a sanity check: the validation
dataset's session, opened by Lightning's len() before training, sits idle
while the training epoch runs. The first training step waits (on the
daemon's log, not a clock) until the daemon has reaped that session as
idle. Each validation batch's sample ids go to OUT/val.jsonl.

    python lightning_idle.py SOCKET LOG OUT
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F

from nvfeed.torch import LoaderDataset

WAIT = 120.0  # conftest.WAIT: far above what the reaping takes


class Net(L.LightningModule):
    def __init__(self, socket: str, log: str, out: str) -> None:
        super().__init__()
        self.socket, self.log, self.out = socket, log, out
        self.lin = torch.nn.Linear(16, 4)

    def step(self, batch: Any) -> torch.Tensor:
        samples, labels = batch
        return F.cross_entropy(self.lin(torch.stack([s[:16].float() / 255 for s in samples])), labels)

    def reaped(self, sid: str) -> bool:
        with open(self.log) as f:
            return any(f"session={sid}" in ln and "idle for more than" in ln for ln in f)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == 0:
            val = self.trainer.val_dataloaders
            if not isinstance(val, LoaderDataset) or val._passes._src is None:
                raise RuntimeError("the validation dataset has no session before training: nothing to reap")
            sid, deadline = val._passes._src._session.id, time.monotonic() + WAIT
            while not self.reaped(str(sid)):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"session {sid} not reaped after {WAIT:.0f} s")
                time.sleep(0.02)
        return self.step(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        ids = [hashlib.sha256(s.numpy().tobytes()).hexdigest()[:16] for s in batch[0]]
        with open(os.path.join(self.out, "val.jsonl"), "a") as f:
            f.write(json.dumps({"epoch": self.current_epoch, "ids": ids}) + "\n")
        self.step(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> LoaderDataset:
        return LoaderDataset("train", socket=self.socket, batch_size=4, random_shuffle=True, seed=7)

    def val_dataloader(self) -> LoaderDataset:
        return LoaderDataset("train", socket=self.socket, batch_size=4)


def main() -> None:
    socket, log, out = sys.argv[1:4]
    torch.manual_seed(0)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, num_sanity_val_steps=0, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        use_distributed_sampler=False)
    trainer.fit(Net(socket, log, out))


if __name__ == "__main__":
    main()
