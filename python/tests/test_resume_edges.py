# SPDX-License-Identifier: Apache-2.0
"""Resume and argument edge cases, each a fault once (the datasets of
test_resume.py: odd sizes over a real loaderd)."""

from __future__ import annotations

import collections

from test_resume import Sets, sets  # noqa: F401 - the module's fixture
from resume_ranks import KINDS, ids
from nvfeed.torch import LoaderDataset


def test_numpy_padding_only_batch_is_empty(sets: Sets) -> None:  # noqa: F811
    """numpy tensors, pad_last_batch, last_batch_policy="partial": 211
    samples on 3 shards of 70, 70 and 71 in batches of 5. The shards of 70
    read a 15th batch of padding alone, which the loop receives empty
    (it raised IndexError in _views.tensors)."""
    got: collections.Counter[str] = collections.Counter()
    for k in range(3):
        ds = LoaderDataset("tens", socket=sets.daemon.socket, batch_size=5, shard_id=k, num_shards=3,
                           pad_last_batch=True, last_batch_policy="partial", **KINDS["tens"])
        n = 0
        for b in ds:
            got.update(ids("tens", b))
            n += 1
        assert n == len(ds) == 15
    assert got == sets.want["tens"]


def test_loader_source_positional_arguments(sets: Sets) -> None:  # noqa: F811
    """LoaderSource(dataset, socket, batch_size, shard_id, num_shards,
    random_shuffle, seed) positionally, as README's API lists them and as
    before the options were declared (it raised TypeError: takes 2
    positional arguments)."""
    import pytest
    from nvfeed import LoaderSource
    with LoaderSource("imgs", sets.daemon.socket, 8, 1, 3, True, 5) as a, \
            LoaderSource("imgs", socket=sets.daemon.socket, batch_size=8, shard_id=1, num_shards=3,
                         random_shuffle=True, seed=5) as b:
        assert [[bytes(s) for s in x[0]] for x in a] == [[bytes(s) for s in x[0]] for x in b]
    with pytest.raises(TypeError, match="multiple values for argument 'socket'"):
        LoaderSource("imgs", sets.daemon.socket, socket=sets.daemon.socket)
    with pytest.raises(TypeError, match="missing a required argument: 'dataset'"):
        LoaderSource()


def test_loader_source_bad_state_is_the_daemons(sets: Sets) -> None:  # noqa: F811
    """state= that is not a State goes to the daemon, which refuses it
    (README: the daemon checks state, a bad one raises BadRequestError), as
    before; it raised KeyError('sampling') or TypeError in the client."""
    import pytest
    from nvfeed import BadRequestError, LoaderSource
    for bad in ({"x": 1}, "abc", {"sampling": 3, "epoch": 0, "batch": 0}):
        with pytest.raises(BadRequestError):
            LoaderSource("imgs", socket=sets.daemon.socket, batch_size=8, state=bad)


def test_dali_external_source_restore_other_seed_refused(sets: Sets) -> None:  # noqa: F811
    """fn.external_source(source=src.batch, batch_info=True) restored from a
    DALI checkpoint into a LoaderSource of another seed: DALI asks for the
    saved positions, which name other samples in the new order. It went on
    silently: epoch 0 of 203 samples held 169 distinct. Now refused, naming
    the seed; the same seed still restores exactly."""
    import pytest
    pytest.importorskip("nvidia.dali")
    from test_dali_checkpoint import BATCH, _pipeline, _steps
    from nvfeed import LoaderSource
    kw = dict(socket=sets.daemon.socket, batch_size=BATCH, shard_id=0, num_shards=1, random_shuffle=True)
    with LoaderSource("imgs", seed=5, **kw) as src:
        pipe = _pipeline(src)
        head = _steps(pipe, 10)
        cp = pipe.checkpoint()
        want = _steps(pipe, 41)  # to epoch 0's end: 51 batches of 4
    with LoaderSource("imgs", seed=5, **kw) as src:
        assert _steps(_pipeline(src, cp), 41) == want
    samples = [x.split(":")[0] for b in head + want for x in b.split()]
    assert len(samples) == len(set(samples)) == 203
    with LoaderSource("imgs", seed=6, **kw) as src:
        with pytest.raises(Exception, match=r"other sampling arguments: seed 5 \(now 6\)"):
            _steps(_pipeline(src, cp), 1)


def test_resume_at_batch_zero_adds_no_stage(sets: Sets) -> None:  # noqa: F811
    """An elastic job restarted again and again before its first step on
    other ranks: each restart at batch 0 added a stage that removed
    nothing, until the daemon refused the open (past MaxStages = 64; at 70
    stages "decoding would take more memory than the message's size
    allows").
    No stage now; a stage at batch 2 then resumes as before, every sample
    once."""
    got: collections.Counter[str] = collections.Counter()
    kw = dict(socket=sets.daemon.socket, random_shuffle=True, seed=3)
    first = [LoaderDataset("imgs", batch_size=8, shard_id=k, num_shards=4, **kw) for k in range(4)]
    its = [iter(d) for d in first]
    for _ in range(2):
        for it in its:
            got.update(ids("imgs", next(it)))
    sd = first[0].state_dict()
    for i in range(70):
        w = 3 + i % 2
        d = LoaderDataset("imgs", batch_size=5 + i % 2, shard_id=0, num_shards=w, **kw)
        d.load_state_dict(sd)
        assert len(d) > 0  # opens the session: the state is then this run's, a stage more
        sd = d.state_dict()
    assert sd["state"]["stages"] == [{"num_shards": 4, "batch_size": 8, "batch": 2}]
    assert sd["batch"] == 2
    for k in range(2):
        d = LoaderDataset("imgs", batch_size=7, shard_id=k, num_shards=2, **kw)
        d.load_state_dict(sd)
        for b in d:
            got.update(ids("imgs", b))
    assert got == sets.want["imgs"]


def test_load_state_dict_before_the_rank_is_known(sets: Sets, monkeypatch) -> None:  # noqa: F811
    """load_state_dict() before torch.distributed is initialised (no RANK,
    WORLD_SIZE): the shard was resolved then, as (0, 1), and a resume on
    the saved 4 ranks became one on other ranks, refused for
    stick_to_shard ("a resume on other num_shards ... cannot be exact").
    The shard is now taken when the session opens: the same batches as a
    run that was not interrupted."""
    kw = dict(socket=sets.daemon.socket, batch_size=8, stick_to_shard=True, random_shuffle=True, seed=3)
    old = LoaderDataset("imgs", shard_id=2, num_shards=4, **kw)
    it = iter(old)
    next(it), next(it)
    sd = LoaderDataset("imgs", shard_id=0, num_shards=4, **kw)
    it0 = iter(sd)
    next(it0), next(it0)
    state = sd.state_dict()
    want = [ids("imgs", b) for b in it]
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    new = LoaderDataset("imgs", **kw)
    new.load_state_dict(state)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert [ids("imgs", b) for b in new] == want


def test_loader_source_takes_rank_0s_state(sets: Sets) -> None:  # noqa: F811
    """LoaderSource(state=rank 0's state) on the same shards resumes this
    rank's shard at that position, as load_state_dict does (the daemon
    refused it: shard_id 0, now 1)."""
    from nvfeed import LoaderSource
    kw = dict(socket=sets.daemon.socket, batch_size=8, num_shards=2, random_shuffle=True, seed=3)
    with LoaderSource("imgs", shard_id=0, **kw) as r0:
        it = iter(r0)
        next(it), next(it)
        st = r0.state()
    with LoaderSource("imgs", shard_id=1, **kw) as fresh:
        want = [[bytes(s) for s in b[0]] for b in fresh][2:]
    with LoaderSource("imgs", shard_id=1, state=st, **kw) as r1:
        got = [[bytes(s) for s in b[0]] for b in r1]
    assert got == want


def test_loader_dataset_shard_checked_at_the_call() -> None:
    """Shard arguments out of range and a decode_labels that is not a bool
    are refused when the dataset is made, naming them (the daemon refused
    the shard only at the first iteration; decode_labels="x" was taken)."""
    import pytest
    for kw, name in ((dict(shard_id=0, num_shards=0), "num_shards"), (dict(shard_id=2, num_shards=2), "shard_id"),
                     (dict(shard_id=-1, num_shards=2), "shard_id"), (dict(decode_labels="x"), "decode_labels")):
        with pytest.raises(ValueError, match=name):
            LoaderDataset("imgs", socket="/nonexistent", **kw)


def test_an_empty_stages_list_is_left_out_for_an_old_daemon() -> None:
    """A version 3 state with no stages goes to a daemon without feature
    stages as version 2 without the key, which that daemon does not know."""
    from nvfeed._version import DaemonVersion, fit
    old = DaemonVersion(2, "0.3.0", frozenset({"file", "versions"}))
    req = {"dataset": "imgs", "state": {"version": 3, "sampling": {}, "epoch": 1, "batch": 2, "stages": []}}
    st = fit(req, old, "sock")["state"]  # type: ignore[arg-type]
    assert st == {"version": 2, "sampling": {}, "epoch": 1, "batch": 2}
