# SPDX-License-Identifier: Apache-2.0
"""PyTorch Lightning (CPU; 1 rank, and 2-rank DDP over gloo) over
LoaderDataset, 3 epochs with validation and its sanity check
(lightning_run.py): every epoch trains and validates every sample exactly
once across the ranks, and a run that crashes mid-epoch resumed from its
last checkpoint (Trainer.fit(ckpt_path=...)) trains exactly the batches
the uninterrupted run did."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, Daemon, Dataset

pytest.importorskip("lightning")

SCRIPT = Path(__file__).parent / "lightning_run.py"
CRASH = 16  # a global step mid-epoch (1 rank: 12 steps an epoch, epoch 1 batch 4; 2 ranks: 6, epoch 2 batch 4)


def run(daemon: Daemon, out: Path, devices: int, crash: int = 0, resume: bool = False, reload: bool = False,
        limit: float = 1.0) -> int:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "python"))
    r = subprocess.run([sys.executable, str(SCRIPT), daemon.socket, str(out), str(devices), str(crash),
                        "1" if resume else "0", "1" if reload else "0", str(limit)], capture_output=True, text=True,
                       timeout=600, env=env, cwd=out)
    if not crash:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    else:
        assert f"crash at step {crash}" in r.stderr, r.stderr[-3000:]
    return r.returncode


def records(out: Path, devices: int) -> list[list[dict[str, Any]]]:
    return [[json.loads(ln) for ln in (out / f"rank{r}.jsonl").read_text().splitlines()] for r in range(devices)]


@pytest.mark.parametrize("devices", [1, 2])
def test_lightning_every_epoch_every_sample_and_exact_resume(daemon: Daemon, dataset: Dataset, tmp_path: Path,
                                                             devices: int) -> None:
    ids = sorted({__import__("hashlib").sha256((dataset.root / p).read_bytes()).hexdigest()[:16]
                  for p, _ in dataset.files})
    whole = tmp_path / "whole"
    whole.mkdir()
    run(daemon, whole, devices)
    ranks = records(whole, devices)
    for phase in ("train", "val"):
        for epoch in range(3):
            seen = sorted(i for rk in ranks for r in rk if r["phase"] == phase and r["epoch"] == epoch for i in r["ids"])
            assert seen == ids, f"{phase} epoch {epoch}: {len(seen)} samples, {len(set(seen))} distinct of {len(ids)}"
    assert all(sum(r["phase"] == "sanity" for r in rk) == 2 for rk in ranks), "the sanity check did not run"

    cut = tmp_path / "cut"
    cut.mkdir()
    run(daemon, cut, devices, crash=CRASH)
    run(daemon, cut, devices, resume=True)
    for i, (want, got) in enumerate(zip(ranks, records(cut, devices))):
        steps = [(r["epoch"], r["batch"], r["ids"]) for r in want if r["phase"] == "train"]
        first = [(r["epoch"], r["batch"], r["ids"]) for r in got if r["phase"] == "train" and r["run"] == "first"]
        resumed = [(r["epoch"], r["batch"], r["ids"]) for r in got if r["phase"] == "train" and r["run"] == "resumed"]
        assert len(first) == CRASH
        assert first + resumed == steps, f"rank {i}: the resumed run trained other batches"
        val = [(r["epoch"], sorted(r["ids"])) for r in want if r["phase"] == "val"]
        assert [v for v in val if v[0] >= resumed[0][0]] == [(r["epoch"], sorted(r["ids"])) for r in got
                                                if r["phase"] == "val" and r["run"] == "resumed"]


def test_lightning_resumes_on_other_devices(daemon: Daemon, dataset: Dataset, tmp_path: Path) -> None:
    # A checkpoint of devices=4 (3 steps an epoch) taken at epoch 1 batch
    # 1, resumed with devices=2: the rest of epoch 1 on 2 ranks
    # (docs/resume.md), then epoch 2: every epoch trains every sample once.
    ids = sorted(hashlib.sha256((dataset.root / p).read_bytes()).hexdigest()[:16] for p, _ in dataset.files)
    run(daemon, tmp_path, 4, crash=4)
    run(daemon, tmp_path, 2, resume=True)
    recs = [r for rk in records(tmp_path, 4) for r in rk if r["phase"] == "train"]
    for epoch in range(3):
        seen = sorted(i for r in recs if r["epoch"] == epoch for i in r["ids"])
        assert seen == ids, f"epoch {epoch}: {len(seen)} samples, {len(set(seen))} distinct of {len(ids)}"
    assert {r["run"] for r in recs if r["epoch"] == 1} == {"first", "resumed"}, "the crash was not in epoch 1"


def test_lightning_datasets_made_anew_every_epoch_go_on(daemon: Daemon, tmp_path: Path) -> None:
    # reload_dataloaders_every_n_epochs=1 makes a new LoaderDataset every
    # epoch; Lightning's set_epoch (on ds.sampler) moves it to that epoch:
    # the same batches as one dataset iterated on, not epoch 0's order again.
    runs = {}
    for reload in (False, True):
        out = tmp_path / f"reload{int(reload)}"
        out.mkdir()
        run(daemon, out, 1, reload=reload)
        runs[reload] = [(r["epoch"], r["batch"], r["ids"]) for r in records(out, 1)[0] if r["phase"] == "train"]
    epochs = [[ids for e, _, ids in runs[False] if e == k] for k in range(3)]
    assert epochs[0] != epochs[1] != epochs[2], "the shuffle gave an epoch the same order"
    assert runs[True] == runs[False], "datasets made anew each epoch trained other batches"


@pytest.mark.parametrize("reload", [False, True], ids=["one-dataset", "anew-each-epoch"])
def test_lightning_limit_train_batches_starts_each_epoch_fresh(daemon: Daemon, tmp_path: Path, reload: bool) -> None:
    # limit_train_batches=0.5: Lightning stops each epoch after half its
    # batches and calls set_epoch at the next one's start (ds.sampler):
    # every epoch trains the first half of its own order (docs/torch.md,
    # Epochs), not where the previous one stopped.
    from nvfeed.torch import LoaderDataset
    run(daemon, tmp_path, 1, reload=reload, limit=0.5)
    got = [[r["ids"] for r in records(tmp_path, 1)[0] if r["phase"] == "train" and r["epoch"] == e] for e in range(3)]
    ds = LoaderDataset("train", socket=daemon.socket, batch_size=4, random_shuffle=True, seed=7)  # lightning_run's
    with warnings.catch_warnings():
        # Epoch 0 begun again in this process (the other parameter's): meant.
        warnings.simplefilter("ignore")
        try:
            half = len(ds) // 2
            for e in range(3):
                ds.set_epoch(e)
                want = []
                for samples, _ in ds:
                    want.append([hashlib.sha256(s.numpy().tobytes()).hexdigest()[:16] for s in samples])
                    if len(want) == half:
                        break
                assert got[e] == want, f"epoch {e}: {len(got[e])} batches, not the first {half} of its order"
        finally:
            ds.close()
