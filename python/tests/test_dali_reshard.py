# SPDX-License-Identifier: Apache-2.0
"""Real DALI, CPU only: a DALI checkpoint of ``nvfeed.dali.reader``
pipelines restored on other shards or another batch size (docs/resume.md,
"DALI's checkpoints"). Four pipelines (ranks) read into the middle of
epoch 1; rank 0's ``pipe.checkpoint()`` restores three, which read on and
checkpoint; that restores two, which read past epoch 2. Every epoch's
samples are the dataset's exactly once across ranks, for class folders,
numpy and WebDataset, with ``pipe.run()`` and with DALIGenericIterator.
What cannot be exact is refused."""

from __future__ import annotations

import collections
import hashlib
from typing import Any, Optional

import numpy as np
import pytest

from test_resume import Sets, sets  # noqa: F401 - the datasets and their daemon (a fixture)

try:
    from nvidia.dali import pipeline_def

    import nvfeed.dali
except Exception as e:  # noqa: BLE001 - any import failure means no DALI here
    pytest.skip(f"cannot import nvidia.dali: {e!r}", allow_module_level=True)

KINDS = {"imgs": {}, "tens": {}, "wds": {"ext": ["bin", "cls"]}}
Plan = list[tuple[int, int, int]]  # (ranks, batch size, iterations) per run


def _pipe(sets: Sets, kind: str, rank: int, ranks: int, bs: int, cp: Optional[bytes], **kw: Any) -> Any:
    @pipeline_def(batch_size=bs, num_threads=1, device_id=None, seed=1, enable_checkpointing=True,
                  prefetch_queue_depth=2)
    def p() -> Any:
        out = nvfeed.dali.reader(kind, socket=sets.daemon.socket, shard_id=rank, num_shards=ranks,
                                 **{"random_shuffle": True, "shuffle": "permute", "seed": 7, "pad_last_batch": True,
                                    **KINDS[kind], **kw})
        return tuple(out) if isinstance(out, (tuple, list)) else out

    pipe = p(checkpoint=cp)
    pipe.build()
    return pipe


def _id(sample: Any) -> str:
    return hashlib.sha256(np.array(sample).tobytes()).hexdigest()[:16]


def _run(pipe: Any, k: int, iterator: bool) -> tuple[list[list[str]], bytes]:
    """k batches of a pipeline (each its samples' ids) and its checkpoint."""
    if iterator:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator
        it = DALIGenericIterator([pipe], ["data"] + [f"o{i}" for i in range(pipe.num_outputs - 1)])
        out = [[_id(x.numpy()) for x in next(it)[0]["data"]] for _ in range(k)]
        return out, it.checkpoints()[0]
    out = []
    for _ in range(k):
        data = pipe.run()[0]
        out.append([_id(data[i]) for i in range(len(data))])
    return out, pipe.checkpoint()


def _read(sets: Sets, kind: str, plan: Plan, iterator: bool = False) -> list[collections.Counter[str]]:
    """Runs the plan, each run restored from the one before's rank 0;
    each epoch's samples across ranks, counted (a rank's padding, its
    shard's last sample again, counted once), for the epochs completed."""
    n, cp = sum(sets.want[kind].values()), None
    epochs: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    epoch, m = 0, n  # where the next run starts: the epoch, its list's length
    for ranks, bs, k in plan:
        runs, cps = [], []
        for r in range(ranks):
            got, c = _run(_pipe(sets, kind, r, ranks, bs, cp), k, iterator)
            runs.append(got)
            cps.append(c)
        cp = cps[0]
        e, size, b, pieces = epoch, m, 0, [set() for _ in range(ranks)]
        for i in range(k):
            for r in range(ranks):
                pieces[r].update(runs[r][i])
            b += 1
            if b == -(-(-(-size // ranks)) // bs):  # the padded shard's batches
                for p in pieces:
                    epochs[e].update(p)
                e, size, b, pieces = e + 1, n, 0, [set() for _ in range(ranks)]
        for p in pieces:
            epochs[e].update(p)
        c = b * bs  # each shard gave its first c samples of epoch e
        epoch, m = (e, size - ranks * c) if c <= size // ranks else (e + 1, n)
    return [epochs[e] for e in range(epoch)]


@pytest.mark.parametrize("kind", list(KINDS))
def test_four_three_two(sets: Sets, kind: str) -> None:
    plan = [(4, 4, 17), (3, 4, 3), (2, 4, 45)]  # mid epoch 1, mid it again, past epoch 2
    got = _read(sets, kind, plan)
    assert len(got) >= 3
    for e, c in enumerate(got):
        assert c == sets.want[kind], f"{kind} epoch {e}: not every sample once"


def test_batch_size_changes(sets: Sets) -> None:
    got = _read(sets, "imgs", [(4, 4, 15), (3, 5, 4), (2, 3, 60)])
    assert len(got) >= 3 and all(c == sets.want["imgs"] for c in got)


def test_generic_iterator(sets: Sets) -> None:
    got = _read(sets, "tens", [(4, 4, 17), (3, 4, 3), (2, 4, 45)], iterator=True)
    assert len(got) >= 3 and all(c == sets.want["tens"] for c in got)


def test_unpadded_stream(sets: Sets) -> None:
    """Without pad_last_batch, 4 ranks in epoch 0 (uneven shards, all at
    batch 5) resume on 3: each new rank's stream is its 41 samples of the
    resumed epoch, then epoch 1's, in batches across that end (copies)."""
    got: collections.Counter[str] = collections.Counter()
    cp = b""
    for r in range(4):
        head, c = _run(_pipe(sets, "imgs", r, 4, 4, None, pad_last_batch=False), 5, False)
        got.update(x for b in head for x in b)
        cp = c if r == 0 else cp
    for r in range(3):
        tail, _ = _run(_pipe(sets, "imgs", r, 3, 4, cp, pad_last_batch=False), 11, False)
        got.update([x for b in tail for x in b][:(203 - 4 * 20) // 3])
    assert got == sets.want["imgs"]


def test_same_shards_unchanged(sets: Sets) -> None:
    """A restore on the saved shards goes on as the run that was not
    interrupted, through a chain of restores."""
    want, _ = _run(_pipe(sets, "imgs", 1, 3, 4, None), 30, False)
    head, cp = _run(_pipe(sets, "imgs", 0, 4, 4, None), 17, False)
    _, cp = _run(_pipe(sets, "imgs", 0, 3, 4, cp), 3, False)
    _, cp3 = _run(_pipe(sets, "imgs", 0, 3, 4, cp), 5, False)  # same shards: from where cp left
    a, _ = _run(_pipe(sets, "imgs", 1, 3, 4, cp), 5, False)
    b, _ = _run(_pipe(sets, "imgs", 1, 3, 4, cp3), 5, False)
    again, _ = _run(_pipe(sets, "imgs", 1, 3, 4, cp), 10, False)
    assert again == a + b
    assert want[:3] != again[:3]  # a resumed epoch, not a fresh run's


@pytest.mark.parametrize("kw, why", [({"shuffle": "dali"}, "shuffle"), ({"stick_to_shard": True}, "stick_to_shard"),
                                     ({"shuffle_after_epoch": True, "random_shuffle": False, "shuffle": "dali"},
                                      "shuffle_after_epoch")])
def test_refused_modes(sets: Sets, kw: dict[str, Any], why: str) -> None:
    _, cp = _run(_pipe(sets, "imgs", 0, 4, 4, None, **kw), 5, False)
    assert _run(_pipe(sets, "imgs", 0, 4, 4, cp, **kw), 1, False)  # the same shards: as ever
    with pytest.raises(Exception, match=why):
        _run(_pipe(sets, "imgs", 0, 3, 4, cp, **kw), 1, False)


def test_refused_reader_name_iterator(sets: Sets) -> None:
    """DALI's iterators size every epoch alike from reader_meta: a
    resumed epoch is shorter, so they are refused after such a restore."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator
    _, cp = _run(_pipe(sets, "tens", 0, 4, 4, None, name="R"), 5, False)
    with pytest.raises(Exception, match="reader_name"):
        DALIGenericIterator([_pipe(sets, "tens", 0, 3, 4, cp, name="R")], ["data"], reader_name="R")
    _, cp = _run(_pipe(sets, "tens", 0, 3, 4, cp, name="R"), 2, False)
    with pytest.raises(Exception, match="reader_name"):  # the same shards, but still the shorter epoch
        DALIGenericIterator([_pipe(sets, "tens", 0, 3, 4, cp, name="R")], ["data"], reader_name="R")
    it = DALIGenericIterator([_pipe(sets, "tens", 0, 4, 4, None, name="R")], ["data"], reader_name="R")
    next(it)
    cp = it.checkpoints()[0]  # the iterator's counts for 4 shards
    with pytest.raises(Exception, match="counts epochs"):
        next(DALIGenericIterator([_pipe(sets, "tens", 0, 3, 4, cp, name="R")], ["data"]))


def test_refused_other_dataset(sets: Sets) -> None:
    _, cp = _run(_pipe(sets, "imgs", 0, 4, 4, None), 5, False)
    with pytest.raises(Exception, match="dataset 'imgs'"):
        _run(_pipe(sets, "wds", 0, 4, 4, cp), 1, False)


def test_refused_uneven_unpadded(sets: Sets) -> None:
    _, cp = _run(_pipe(sets, "imgs", 0, 4, 4, None, pad_last_batch=False), 14, False)
    with pytest.raises(Exception, match="different places"):
        _run(_pipe(sets, "imgs", 0, 3, 4, cp, pad_last_batch=False), 1, False)


def test_old_checkpoint_warns(sets: Sets) -> None:
    """A checkpoint without nvfeed's state (DALI's own, as an older nvfeed
    took it) restores as on the saved shards, with a warning."""
    pipe = _pipe(sets, "imgs", 0, 4, 4, None)
    want, _ = _run(pipe, 8, False)
    pipe = _pipe(sets, "imgs", 0, 4, 4, None)
    _run(pipe, 3, False)
    old = type(pipe)._get_checkpoint(pipe)
    with pytest.warns(RuntimeWarning, match="did not save its state"):
        tail, _ = _run(_pipe(sets, "imgs", 0, 4, 4, old), 5, False)
    assert tail == want[3:]
