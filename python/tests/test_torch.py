# SPDX-License-Identifier: Apache-2.0
"""Real PyTorch (CPU) against a real loaderd: nvfeed.torch.LoaderDataset in
training loops, one rank and two (torchrun, gloo): every sample once an
epoch, kept tensors unchanged, exact resume from state_dict(); the
zero-copy rule; the example script; and the client installing into a
PyTorch environment without touching it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import REPO, REQUIRE_VAR, Daemon, Dataset

try:
    import torch
    import torch.nn.functional as F
    import torch.utils.data
    from torchvision.io import decode_jpeg
except Exception as e:  # noqa: BLE001 - any import failure means no torch here
    if os.environ.get(REQUIRE_VAR) == "1":  # CI: real torch is part of the test environment
        raise ImportError(f"torch/torchvision do not import ({REQUIRE_VAR}=1: this machine must run the torch tests; "
                          f"scripts/venv.sh installs python/requirements-torch.txt): {e!r}") from e
    pytest.skip(f"cannot import torch/torchvision: {e!r}", allow_module_level=True)

import nvfeed.torch
from nvfeed import BadRequestError
from nvfeed.torch import EpochRepeatWarning, LoaderDataset, TorchBatch

BATCH = 4  # 45 samples: 12 batches an epoch, the last of 1


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def batches(ds: LoaderDataset) -> Iterator[TorchBatch]:
    """The dataset's batches, epoch after epoch."""
    while True:
        yield from ds


def fmt(batch: TorchBatch) -> str:
    """A batch as one string: the samples' hashes and labels."""
    samples, labels = batch
    return " ".join(f"{digest(s)[:12]}:{int(lbl)}" for s, lbl in zip(samples, labels))


def steps(it: Iterator[TorchBatch], n: int) -> list[str]:
    """The next n batches, by fmt."""
    return [fmt(next(it)) for _ in range(n)]


class Trainer:
    """A small convolutional net trained with SGD on the decoded JPEGs."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                         torch.nn.Flatten(), torch.nn.Linear(8, 4))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)

    def step(self, jpegs: list[torch.Tensor], labels: torch.Tensor) -> float:
        x = torch.stack([F.interpolate(im.unsqueeze(0).float(), size=(16, 16), mode="bilinear", align_corners=False)[0]
                         for im in decode_jpeg(jpegs)]) / 255.0
        loss = F.cross_entropy(self.model(x), labels)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return float(loss.detach())


def test_one_rank_trains_on_every_sample_once_and_kept_tensors_stay(daemon: Daemon, dataset: Dataset) -> None:
    want = sorted(f"{h}:{lbl}" for h, (_, lbl) in dataset.by_hash.items())
    ds = LoaderDataset("train", socket=daemon.socket, batch_size=BATCH, random_shuffle=True, seed=3)
    trainer = Trainer()
    kept: list[tuple[torch.Tensor, str]] = []
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(3):
            seen = []
            for jpegs, labels in torch.utils.data.DataLoader(ds, batch_size=None):
                assert labels.dtype == torch.int64 and labels.shape == (len(jpegs),)
                assert all(j.dtype == torch.uint8 and j.dim() == 1 for j in jpegs)
                losses.append(trainer.step(jpegs, labels))
                hs = [digest(j) for j in jpegs]
                kept += zip(jpegs, hs)
                seen += [f"{h}:{int(lbl)}" for h, lbl in zip(hs, labels)]
            assert sorted(seen) == want, f"epoch {epoch}: not every sample once"
    # (torchvision 0.29 warns that its decoders are deprecated: not ours.)
    assert [str(w.message) for w in caught if "torchvision" not in w.filename and w.category is not EpochRepeatWarning] == [], "a warning was printed"
    changed = sum(digest(t) != h for t, h in kept)
    assert (changed, len(kept)) == (0, 3 * 45), f"{changed} of {len(kept)} kept tensors changed after 3 epochs"
    assert all(h in dataset.by_hash for _, h in kept)
    # Copies are the loop's own: writing one changes nothing else (and kills nothing).
    kept[0][0].zero_()
    assert sum(digest(t) != h for t, h in kept[1:]) == 0
    assert all(loss == loss for loss in losses)  # no NaN: it trained
    ds.close()


def test_zero_copy_valid_until_the_next_batch(daemon: Daemon, dataset: Dataset) -> None:
    """zero_copy=True: views of batch memory, right (and no warning) until
    the next batch is asked for; kept longer, they change: the reason the
    default copies."""
    ds = LoaderDataset("train", socket=daemon.socket, batch_size=BATCH, random_shuffle=True, seed=3, zero_copy=True)
    kept: list[tuple[torch.Tensor, str]] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for jpegs, labels in ds:
            for j, lbl in zip(jpegs, labels):
                h = digest(j)
                assert dataset.by_hash[h][1] == int(lbl), "a zero-copy batch is wrong when received"
                kept.append((j, h))
            # Still right at the end of the step, just before the next batch is asked for.
            assert all(digest(j) == h for j, h in kept[-len(jpegs):])
    assert [str(w.message) for w in caught if w.category is not EpochRepeatWarning] == []
    assert len(kept) == 45
    changed = sum(digest(t) != h for t, h in kept)
    assert changed > 0, "kept zero-copy views never changed: the lifetime rule's test proves nothing"
    ds.close()


@pytest.mark.parametrize("k", [3, 12, 14])  # mid-epoch, at the epoch's end, into the next epoch
def test_state_dict_resumes_exactly(daemon: Daemon, k: int) -> None:
    kw: dict[str, Any] = dict(socket=daemon.socket, batch_size=BATCH, random_shuffle=True, seed=9)
    whole = LoaderDataset("train", **kw)
    want = steps(batches(whole), 30)
    whole.close()
    first = LoaderDataset("train", **kw)
    head = steps(batches(first), k)
    sd = json.loads(json.dumps(first.state_dict()))  # plain values: fit for torch.save and JSON
    # A loop that received an epoch's 12 batches has finished it: the
    # position is the next epoch's first batch.
    assert (sd["epoch"], sd["batch"]) == divmod(k, 12)
    first.close()
    second = LoaderDataset("train", **kw)
    second.load_state_dict(sd)
    assert second.state_dict() == sd
    # Through a DataLoader (no workers), epoch after epoch.
    tail: list[str] = []
    while len(tail) < 30 - k:
        for b in torch.utils.data.DataLoader(second, batch_size=None):
            tail.append(fmt(b))
            if len(tail) == 30 - k:
                break
    assert head + tail == want
    second.close()


def test_rank0_state_resumes_another_rank(daemon: Daemon) -> None:
    kw: dict[str, Any] = dict(socket=daemon.socket, batch_size=BATCH, random_shuffle=True, seed=9, num_shards=2)
    r1 = LoaderDataset("train", shard_id=1, **kw)
    want = steps(batches(r1), 10)
    r1.close()
    r0 = LoaderDataset("train", shard_id=0, **kw)
    steps(batches(r0), 4)
    sd = r0.state_dict()
    r0.close()
    resumed = LoaderDataset("train", shard_id=1, **kw)
    resumed.load_state_dict(sd)
    assert steps(batches(resumed), 6) == want[4:]
    resumed.close()


def test_load_state_dict_refuses_other_runs(daemon: Daemon, dataset: Dataset) -> None:
    kw: dict[str, Any] = dict(socket=daemon.socket, random_shuffle=True, seed=9)
    ds = LoaderDataset("train", batch_size=BATCH, **kw)
    first = [hashlib.sha256(t.numpy().tobytes()).hexdigest() for t in next(iter(ds))[0]]
    sd = ds.state_dict()
    ds.close()
    # Another batch size goes on with the epoch's other samples (docs/resume.md).
    other = LoaderDataset("train", batch_size=5, **kw)
    other.load_state_dict(sd)
    rest = [hashlib.sha256(t.numpy().tobytes()).hexdigest() for samples, _ in other for t in samples]
    other.close()
    assert sorted(first + rest) == sorted(dataset.by_hash), "another batch size: not the epoch's samples once"
    with pytest.raises(ValueError, match="for dataset 'train', this dataset reads 'other'"):
        LoaderDataset("other", batch_size=BATCH, **kw).load_state_dict(sd)
    with pytest.raises(ValueError, match="not a state_dict"):
        LoaderDataset("train", batch_size=BATCH, **kw).load_state_dict({"epoch": 1})
    other_seed = LoaderDataset("train", socket=daemon.socket, batch_size=BATCH, random_shuffle=True, seed=10)
    other_seed.load_state_dict(sd)
    with pytest.raises(BadRequestError, match="seed"):
        next(iter(other_seed))


def test_two_ranks_torchrun(daemon: Daemon, dataset: Dataset, tmp_path: Path) -> None:
    """torchrun, two ranks, gloo, DDP: the shards come from torch.distributed
    and together hold every sample once an epoch; kept tensors unchanged;
    rank 0's state_dict() resumes both ranks exactly."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(Path(__file__).parent / "torch_ranks.py"), daemon.socket, str(tmp_path), str(BATCH), "2", "8"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    assert [rk["shard"] for rk in ranks] == [[0, 2], [1, 2]]
    want = sorted(f"{h}:{lbl}" for h, (_, lbl) in dataset.by_hash.items())
    for e in range(2):
        assert sorted(ranks[0]["epochs"][e] + ranks[1]["epochs"][e]) == want, f"epoch {e}: not every sample once"
    for i, rk in enumerate(ranks):
        # The shards rotate (no stick_to_shard): 22 samples, then 23, or the reverse.
        assert sorted(len(e) for e in rk["epochs"]) == [22, 23]
        assert (rk["changed"], rk["kept"]) == (0, 45), f"rank {i}: kept tensors changed"
        assert rk["resumed"] == rk["steps"], f"rank {i}: the resumed run differs"


def test_dataloader_workers_refused(daemon: Daemon) -> None:
    ds = LoaderDataset("train", socket=daemon.socket, batch_size=BATCH)
    with pytest.raises(RuntimeError, match="DataLoader worker 0 of 1: use it in the training process"):
        next(iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1)))


def test_shard_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert LoaderDataset("train").shard == (0, 1)
    assert LoaderDataset("train", shard_id=2, num_shards=3).shard == (2, 3)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert LoaderDataset("train").shard == (1, 4)
    for rank, world, msg in [("4", "4", r"RANK=4 must be in \[0, WORLD_SIZE=4\)"), ("x", "4", "must be integers")]:
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", world)
        with pytest.raises(ValueError, match=msg):
            LoaderDataset("train").shard
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(ValueError, match="set both or neither"):
        LoaderDataset("train").shard


def test_arguments_checked_at_once() -> None:
    with pytest.raises(ValueError, match="give both shard_id and num_shards or neither"):
        LoaderDataset("train", shard_id=1)
    with pytest.raises(ValueError, match="zero_copy must be True or False"):
        LoaderDataset("train", zero_copy="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device must be 'cpu', 'cuda' or 'cuda:N', got 'mps'"):
        LoaderDataset("train", device="mps")


def test_former_name() -> None:
    import dali_source.torch
    from dali_source.torch import LoaderDataset as Former
    assert dali_source.torch is nvfeed.torch and Former is LoaderDataset


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: LoaderDataset(device='cuda') not run here")
def test_gpu_tensors(daemon: Daemon, dataset: Dataset) -> None:
    for zero_copy in (False, True):
        ds = LoaderDataset("train", socket=daemon.socket, batch_size=BATCH, device="cuda", zero_copy=zero_copy)
        kept = []
        for jpegs, labels in ds:
            for j, lbl in zip(jpegs, labels):
                assert j.is_cuda
                h = hashlib.sha256(j.cpu().numpy().tobytes()).hexdigest()
                assert dataset.by_hash[h][1] == int(lbl)
                kept.append((j, h))
        if not zero_copy:
            assert sum(hashlib.sha256(j.cpu().numpy().tobytes()).hexdigest() != h for j, h in kept) == 0
        ds.close()


def test_example_trains_and_resumes(daemon: Daemon, tmp_path: Path) -> None:
    """examples/torch_train.py: ResNet-18 on the CPU, two epochs, then a
    third resumed from its checkpoint."""
    ck = tmp_path / "ck.pt"
    cmd = [sys.executable, str(REPO / "python" / "examples" / "torch_train.py"), "--socket", daemon.socket,
           "--batch-size", "8", "--size", "32", "--checkpoint", str(ck), "--save-every", "4"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(cmd + ["--epochs", "2"], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [ln.split(",")[0] for ln in r.stdout.splitlines()] == ["rank 0 epoch 0: 45 samples", "rank 0 epoch 1: 45 samples"]
    r = subprocess.run(cmd + ["--epochs", "3"], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "resumed at step 12: epoch 2 batch 0" and lines[1].startswith("rank 0 epoch 2: 45 samples"), lines


def test_client_installs_into_a_torch_environment_unchanged(tmp_path: Path) -> None:
    """The client's requirements are ranges: installing it where torch is
    (this venv: torch and the CUDA libraries it pins) changes no other
    package; nothing of its own is pinned, its torch extra included."""
    import tomllib
    deps = tomllib.loads((REPO / "python" / "pyproject.toml").read_text())["project"]
    for d in deps["dependencies"] + [d for ds in deps["optional-dependencies"].values() for d in ds]:
        assert "==" not in d and "<" not in d, f"the client pins {d!r}: its requirements must be ranges"
    assert deps["optional-dependencies"]["torch"] == ["torch>=2.0"]
    assert 'Requires-Dist: torch>=2.0; extra == \\"torch\\"' in (REPO / "scripts" / "mkwheel.py").read_text(), \
        "the wheel's torch extra differs from pyproject.toml's"
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation", "-q",
                        "--report", str(report), str(REPO / "python")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert [i["metadata"]["name"] for i in json.loads(report.read_text())["install"]] == ["nvfeed"]
