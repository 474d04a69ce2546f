# SPDX-License-Identifier: Apache-2.0
"""LoaderDataset's epochs as PyTorch loops count them (a loop that took
len(ds) batches has finished its epoch; an evaluation pass that stops
early eats nothing), its last-batch policies across ranks (no sample
twice, as many batches on every rank), and what it yields cannot be
mistaken (zero-copy tensors refuse writes, a dense batch refuses to be
unpacked as (samples, labels), a file batch says what it is)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, Daemon, Dataset

torch = pytest.importorskip("torch")

from nvfeed.torch import DenseBatch, EpochRepeatWarning, LoaderDataset, ReadOnlyTensor  # noqa: E402

N = 45  # the shared dataset's samples


def labelled(batch: object) -> list[str]:
    import hashlib
    samples, labels = batch  # type: ignore[misc]
    return [f"{hashlib.sha256(s.numpy().tobytes()).hexdigest()}:{int(lbl)}" for s, lbl in zip(samples, labels)]


def test_a_loop_of_len_batches_finishes_its_epoch(daemon: Daemon) -> None:
    ds = LoaderDataset("train", socket=daemon.socket, batch_size=4, random_shuffle=True, seed=1)
    got = [sum(len(b[0]) for b in itertools.islice(ds, len(ds))) for _ in range(4)]
    assert got == [N] * 4, "an epoch after a loop of len(ds) batches was not a whole epoch"
    assert ds.state_dict()["epoch"] == 4 and ds.state_dict()["batch"] == 0
    ds.close()


def test_a_training_loop_that_stopped_early_goes_on(daemon: Daemon) -> None:
    ds = LoaderDataset("train", socket=daemon.socket, batch_size=4)
    first = [labelled(b) for b in itertools.islice(ds, 5)]
    rest = [labelled(b) for b in ds]
    assert len(first) + len(rest) == 12 and len(set(sum(first + rest, []))) == N
    ds.close()


def test_an_evaluation_pass_that_stopped_early_eats_nothing(daemon: Daemon) -> None:
    """The sanity check: 2 batches with autograd off, then the real
    validation epochs each see every sample; state_dict() between them
    says the epoch's start."""
    ds = LoaderDataset("train", socket=daemon.socket, batch_size=4, random_shuffle=True, seed=2)
    with torch.inference_mode():
        assert len(list(itertools.islice(ds, 2))) == 2
    assert (ds.state_dict()["epoch"], ds.state_dict()["batch"]) == (0, 0)
    for epoch in range(2):
        with torch.no_grad():
            seen = sum((labelled(b) for b in ds), [])
        assert len(seen) == len(set(seen)) == N, f"validation epoch {epoch} did not see every sample once"
    ds.close()


@pytest.mark.parametrize("batch,pad", [(4, True), (4, False), (11, True), (11, False)])
def test_partial_gives_every_rank_as_many_batches_and_no_sample_twice(daemon: Daemon, batch: int, pad: bool) -> None:
    """Shards of 22 and 23 samples. Batch 11: 3 batches on every rank, the
    22-sample shard's last one empty (as DALI's iterators give); padding,
    if read, never reaches the loop."""
    ranks = [LoaderDataset("train", socket=daemon.socket, batch_size=batch, shard_id=r, num_shards=2,
                           pad_last_batch=pad, random_shuffle=True, seed=4) for r in range(2)]
    for epoch in range(3):
        per_rank = [[labelled(b) for b in ds] for ds in ranks]
        assert [len(p) for p in per_rank] == [len(ds) for ds in ranks] == [-(-23 // batch)] * 2
        seen = [s for p in per_rank for b in p for s in b]
        assert len(seen) == len(set(seen)) == N, f"epoch {epoch}: {len(seen)} samples, {len(set(seen))} distinct"
    for ds in ranks:
        ds.close()


def test_drop_gives_whole_batches_only(daemon: Daemon) -> None:
    ranks = [LoaderDataset("train", socket=daemon.socket, batch_size=4, shard_id=r, num_shards=2,
                           last_batch_policy="drop") for r in range(2)]
    for _ in range(2):
        sizes = [[len(b[0]) for b in ds] for ds in ranks]
        assert sizes == [[4] * 5, [4] * 5]
    for ds in ranks:
        ds.close()


def test_zero_copy_tensors_refuse_writes(daemon: Daemon) -> None:
    """In a subprocess: a write that reached the read-only mapping would be
    a segfault, which fails this test cleanly."""
    code = textwrap.dedent(f"""
        import torch
        from nvfeed.torch import LoaderDataset, ReadOnlyTensor
        ds = LoaderDataset("train", socket={daemon.socket!r}, batch_size=4, zero_copy=True)
        samples, labels = next(iter(ds))
        s = samples[0]
        assert isinstance(s, ReadOnlyTensor)
        for name, write in [("zero_", lambda: s.zero_()), ("setitem", lambda: s.__setitem__(0, 1)),
                            ("iadd", lambda: s.__iadd__(1)), ("view", lambda: s[1:3].fill_(0)),
                            ("out=", lambda: torch.add(s, 1, out=s)), ("numpy", lambda: s.numpy().fill(0))]:
            try:
                write()
            except (RuntimeError, ValueError) as e:
                assert "read-only" in str(e), (name, e)
            else:
                raise AssertionError(name + " wrote")
        c = s.clone()
        c.zero_()  # a copy is the loop's own
        assert not isinstance(s + 1, ReadOnlyTensor) and int(c.sum()) == 0
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO / "python")))
    assert r.returncode == 0 and r.stdout.strip() == "ok", f"rc {r.returncode}: {r.stderr[-2000:]}"


def test_batches_cannot_be_mistaken(daemon: Daemon) -> None:
    ds = LoaderDataset("train", socket=daemon.socket, batch_size=4)
    b = next(iter(ds))
    with pytest.raises(AttributeError, match=r"yields \(samples, labels\) a batch.*no \.shape"):
        b.shape  # type: ignore[union-attr]
    ds.close()
    dense = torch.arange(12.0).reshape(2, 6).as_subclass(DenseBatch)
    with pytest.raises(TypeError, match=r"one tensor \(batch, \*shape\) a batch, not \(samples, labels\)"):
        samples, labels = dense
    assert [r.tolist() for r in dense.unbind(0)] == [list(range(6)), list(range(6, 12))]
    assert type(dense * 2) is torch.Tensor and not isinstance(dense[0], ReadOnlyTensor)


def test_a_dataloader_under_lightning_warns_once(daemon: Daemon) -> None:
    # A DataLoader has no state_dict(): under Lightning it silently loses a
    # mid-epoch position, so the dataset steers to the form that resumes;
    # a plain loop (Lightning merely imported) is not warned.
    pl = pytest.importorskip("lightning.pytorch")
    import warnings

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch: object, _: int) -> torch.Tensor:
            _, labels = batch  # type: ignore[misc]
            return ((self.w - labels.float().mean()) ** 2).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def said(caught: list[warnings.WarningMessage]) -> list[str]:
        return [str(w.message) for w in caught if "state_dict" in str(w.message)]

    ds = LoaderDataset("train", socket=daemon.socket, batch_size=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sum(len(b[0]) for b in torch.utils.data.DataLoader(ds, batch_size=None)) == N
    assert not said(caught), "a plain loop was warned"
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Tiny(), train_dataloaders=torch.utils.data.DataLoader(ds, batch_size=None))
    got = said(caught)
    assert len(got) == 1 and "Return the dataset itself" in got[0], got
    ds.close()


def epochs_of(ds: LoaderDataset, n: int) -> list[list[str]]:
    return [sum((labelled(b) for b in ds), []) for _ in range(n)]


def test_set_epoch_makes_a_new_dataset_go_on(daemon: Daemon) -> None:
    # A dataset made anew each epoch (Lightning's reload_dataloaders_every_
    # n_epochs, a loop that builds it each epoch) yields, after
    # set_epoch(e), the epoch e of one dataset iterated on.
    def make() -> LoaderDataset:
        return LoaderDataset("train", socket=daemon.socket, batch_size=4, random_shuffle=True, seed=42)
    one = make()
    want = epochs_of(one, 3)
    one.close()
    assert want[0] != want[1] != want[2], "the shuffle gave the same order twice"
    for e in range(3):
        ds = make()
        ds.set_epoch(e)
        assert len(ds) == 12 and epochs_of(ds, 1) == [want[e]], f"set_epoch({e}) on a new dataset"
        ds.close()
    # On an open session too, forwards and back; Lightning finds it on .sampler.
    ds = make()
    assert epochs_of(ds, 1) == [want[0]]
    ds.sampler.set_epoch(2)
    assert epochs_of(ds, 1) == [want[2]]
    ds.set_epoch(1)
    assert epochs_of(ds, 1) == [want[1]]
    ds.close()


def test_set_epoch_keeps_a_position_in_that_epoch(daemon: Daemon) -> None:
    ds = LoaderDataset("train", socket=daemon.socket, batch_size=4, random_shuffle=True, seed=3)
    whole = epochs_of(ds, 2)
    ds.close()
    ds = LoaderDataset("train", socket=daemon.socket, batch_size=4, random_shuffle=True, seed=3)
    head = [labelled(b) for b in itertools.islice(ds, len(ds) + 5)][len(ds):]  # epoch 1, 5 batches in
    state = ds.state_dict()
    ds.close()
    resumed = LoaderDataset("train", socket=daemon.socket, batch_size=4, random_shuffle=True, seed=3)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # what Lightning calls after restoring a mid-epoch checkpoint
    assert sum(head, []) + sum((labelled(b) for b in resumed), []) == whole[1]
    resumed.close()
    with pytest.raises(ValueError, match=r"set_epoch: epoch must be an int"):
        resumed.set_epoch(-1)


def test_a_dataset_made_again_without_set_epoch_warns(daemon: Daemon) -> None:
    import warnings
    seed = 4242  # a sampling no other test of this process began
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            ds = LoaderDataset("train", socket=daemon.socket, batch_size=4, random_shuffle=True, seed=seed)
            list(ds)
            ds.close()
    told = [str(w.message) for w in caught if w.category is EpochRepeatWarning]
    assert len(told) == 1 and "set_epoch(epoch)" in told[0], told
    with warnings.catch_warnings(record=True) as caught:  # set_epoch: nothing to tell
        warnings.simplefilter("always")
        for e in range(3):  # set_epoch(0) too: the loop chose epoch 0
            ds = LoaderDataset("train", socket=daemon.socket, batch_size=4, random_shuffle=True, seed=seed + 1)
            ds.set_epoch(e)
            list(ds)
            ds.close()
    assert not [w for w in caught if w.category is EpochRepeatWarning]


def test_a_dataloader_that_batches_again_is_refused(daemon: Daemon) -> None:
    # DataLoader's default batch_size=1 would wrap each batch in another
    # dimension: refused at the first batch, naming batch_size=None.
    ds = LoaderDataset("train", socket=daemon.socket, batch_size=4)
    for loader in (torch.utils.data.DataLoader(ds), torch.utils.data.DataLoader(ds, batch_size=8)):
        with pytest.raises(TypeError, match=r"batch_size=None"):
            next(iter(loader))
    assert sum(len(b[0]) for b in torch.utils.data.DataLoader(ds, batch_size=None)) == N
    ds.close()
