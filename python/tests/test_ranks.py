# SPDX-License-Identifier: Apache-2.0
"""Ranks that cannot silently disagree: the sources of one job compared by
the daemon (``job_id``) and across processes through ``torch.distributed``
(gloo, two real processes), each difference named; every argument checked
where it enters, with its range."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from conftest import REPO, Daemon, Dataset, small_dataset, start_daemon, stop_daemon
from nvfeed import ConflictError, LoaderSource, NotFoundError, RankMismatchError, datasets
from nvfeed._errors import error_for
from nvfeed._ranks import Peers, disagreements, peers, terms


@pytest.fixture(scope="module")
def two(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon serving train and another dataset, val."""
    work = tmp_path_factory.mktemp("ranks")
    _, val, _ = small_dataset(dataset.root.parent, "ranks-val")
    d = start_daemon(work, dataset.bmap, "--dataset", f"val={val}")
    yield d
    assert stop_daemon(d) == 0, d.log.read_text()


KW: dict[str, Any] = dict(batch_size=4, num_shards=2, random_shuffle=True, seed=12)


def test_job_ranks_with_another_seed_raise(two: Daemon) -> None:
    """Two sources of one job_id with other seeds: the second raises, naming
    seed and both values; the first is untouched and reads on."""
    with LoaderSource("train", socket=two.socket, job_id="run-7/train", shard_id=0, **KW) as a:
        with pytest.raises(RankMismatchError) as ei:
            LoaderSource("train", socket=two.socket, job_id="run-7/train", shard_id=1, **{**KW, "seed": 13})
        msg = str(ei.value)
        assert "ranks disagree: " in msg and "seed 13 (the job's: 12)" in msg, msg
        assert isinstance(ei.value, ConflictError) and ei.value.status == 409
        assert ei.value.error_code == "rank_mismatch"
        assert "num_shards" not in msg and "batch_size" not in msg, msg
        assert len(next(a)[0]) == 4
        with LoaderSource("train", socket=two.socket, job_id="run-7/train", shard_id=1, **KW) as b:
            assert len(next(b)[0]) == 4


@pytest.mark.parametrize("status, code, text, cls", [
    (409, "rank_mismatch", "anything at all", RankMismatchError),
    (409, None, "ranks disagree: seed 13 (the job's: 12)", ConflictError),  # the text is never parsed
    (409, "conflict", "ranks disagree: seed 13", ConflictError),
    (404, "not_found", "unknown dataset x", NotFoundError),
])
def test_error_class_by_code_not_text(status: int, code: Any, text: str, cls: type) -> None:
    """The daemon's error code picks the class: RankMismatchError for
    "rank_mismatch" whatever the text, never for text that only reads
    like it; the code and status are kept on the error."""
    e = error_for(text, status, code)
    assert type(e) is cls and e.status == status and e.error_code == code and str(e) == text


@pytest.mark.parametrize("change, named", [
    ({"num_shards": 4}, "num_shards 4 (the job's: 2)"),
    ({"batch_size": 8}, "batch_size 8 (the job's: 4)"),
    ({"shuffle": "dali"}, "shuffle dali (the job's: permute)"),
    ({"random_shuffle": False}, "random_shuffle false (the job's: true)"),
    ({"pad_last_batch": True}, "pad_last_batch true (the job's: false)"),
    ({"stick_to_shard": True}, "stick_to_shard true (the job's: false)"),
    ({"dataset": "val"}, "dataset \"val\", fingerprint "),
    ({"shard_id": 0}, "shard_id 0 is already read by session "),
])
def test_job_names_each_difference(two: Daemon, change: dict[str, Any], named: str) -> None:
    args = {**KW, "shard_id": 1, **change}
    ds = args.pop("dataset", "train")
    with LoaderSource("train", socket=two.socket, job_id="j", shard_id=0, **KW):
        with pytest.raises(RankMismatchError, match=re.escape(named)):
            LoaderSource(ds, socket=two.socket, job_id="j", **args)


def test_jobs_are_per_job_id_and_go_with_their_sessions(two: Daemon) -> None:
    """Without a job_id, or under another one, nothing is compared; once a
    job's sessions are closed its record is gone and new terms are taken."""
    with LoaderSource("train", socket=two.socket, job_id="a", shard_id=0, **KW):
        LoaderSource("train", socket=two.socket, shard_id=1, **{**KW, "seed": 1}).close()
        LoaderSource("train", socket=two.socket, job_id="b", shard_id=1, **{**KW, "seed": 1}).close()
    with LoaderSource("train", socket=two.socket, job_id="a", shard_id=1, **{**KW, "seed": 1}):
        pass


def test_fingerprint(two: Daemon, dataset: Dataset) -> None:
    """The open gives the dataset's fingerprint, as datasets() does; the
    same files mapped elsewhere give the same one; fingerprint= pins it."""
    infos = {d["name"]: d for d in datasets(two.socket)}
    with LoaderSource("train", socket=two.socket, batch_size=4) as src:
        assert re.fullmatch(r"[0-9a-f]{32}", src.fingerprint)
        assert src.fingerprint == infos["train"]["fingerprint"] != infos["val"]["fingerprint"]
        LoaderSource("train", socket=two.socket, batch_size=4, fingerprint=src.fingerprint).close()
        with pytest.raises(ConflictError, match=f"dataset val has fingerprint {infos['val']['fingerprint']}, not the {src.fingerprint}"):
            LoaderSource("val", socket=two.socket, batch_size=4, fingerprint=src.fingerprint)


def test_fingerprint_same_on_another_copy(dataset: Dataset, tmp_path: Path) -> None:
    """Another node's copy (the same files elsewhere, mapped again, served by
    another daemon) has the same fingerprint; a changed file changes it."""
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(dataset.root), str(copy)], check=True)
    maps = tmp_path / "maps"
    maps.mkdir()
    bmap = maps / "copy.bmap"
    subprocess.run([str(REPO / "bin" / "mkbmap"), "--mountpoint", str(copy), "-o", str(bmap)], check=True, capture_output=True)
    first = next(iter(sorted(copy.glob("*/*.jpg"))))
    first.write_bytes(first.read_bytes() + b"\0")
    changed = maps / "changed.bmap"
    subprocess.run([str(REPO / "bin" / "mkbmap"), "--mountpoint", str(copy), "-o", str(changed)], check=True, capture_output=True)
    d = start_daemon(tmp_path, dataset.bmap, "--dataset", f"copy={bmap}", "--dataset", f"changed={changed}")
    try:
        fp = {i["name"]: i["fingerprint"] for i in datasets(d.socket)}
        assert fp["train"] == fp["copy"] != fp["changed"], fp
    finally:
        assert stop_daemon(d) == 0


@pytest.mark.parametrize("kwargs, message", [
    ({"num_shards": 0}, "num_shards must be an int in [1, 2147483647] (the number of ranks; 0 does not mean 1), got 0"),
    ({"num_shards": -2}, "num_shards must be an int in [1, 2147483647]"),
    ({"num_shards": 2.0}, "num_shards must be an int in [1, 2147483647]"),
    ({"shard_id": 2, "num_shards": 2}, "shard_id must be an int in [0, 1] (num_shards is 2), got 2"),
    ({"shard_id": -1}, "shard_id must be an int in [0, 0] (num_shards is 1), got -1"),
    ({"batch_size": 0}, "batch_size must be an int in [1, 65536], got 0"),
    ({"batch_size": 65537}, "batch_size must be an int in [1, 65536], got 65537"),
    ({"seed": -1}, "seed must be an int in [0, 18446744073709551615], got -1"),
    ({"seed": 2**64}, "seed must be an int in [0, 18446744073709551615]"),
    ({"random_shuffle": 1}, "random_shuffle must be True or False, got 1"),
    ({"pad_last_batch": "yes"}, "pad_last_batch must be True or False, got 'yes'"),
    ({"prefetch_queue_depth": 0}, "prefetch_queue_depth must be an int in [1, 64] or None (the daemon's default), got 0"),
    ({"prefetch_queue_depth": 65}, "prefetch_queue_depth must be an int in [1, 64] or None (the daemon's default), got 65"),
    ({"release_after": -1}, "release_after must be an int in [0, 64] or None (derived from the DALI pipeline), got -1"),
    ({"release_after": 65}, "release_after must be an int in [0, 64] or None (derived from the DALI pipeline), got 65"),
    ({"device_id": -1}, "device_id must be an int in [0, 1023], got -1"),
    ({"initial_fill": 0}, "initial_fill must be an int in [1, 16777216], got 0"),
    ({"job_id": "x" * 129}, "job_id must be a str of at most 128 bytes, got one of 129 bytes"),
    ({"job_id": "a\nb"}, "job_id must have no control characters, got 'a\\nb'"),
    ({"job_id": 7}, "job_id must be a str of at most 128 bytes, got 7"),
    ({"fingerprint": "ABC"}, "fingerprint must be 32 lowercase hex digits"),
    ({"check_ranks": None}, "check_ranks must be True or False, got None"),
    ({"timeout": 0}, "timeout must be a finite number of seconds > 0, got 0"),
])
def test_every_argument_checked_before_connecting(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    """A ValueError naming the argument and its range, before any daemon is
    asked (the socket here does not exist)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        LoaderSource("train", socket=str(tmp_path / "none.sock"), **kwargs)


def test_numpy_integers_taken(two: Daemon) -> None:
    """Arguments computed with numpy (np.int64 ranks) are ints too."""
    with LoaderSource("train", socket=two.socket, batch_size=np.int64(4), shard_id=np.int32(1), num_shards=np.int64(2),
                      seed=np.uint64(3), random_shuffle=np.bool_(True), prefetch_queue_depth=np.int8(3)) as src:
        assert len(next(src)[0]) == 4 and src.prefetch_queue_depth == 3


# --- the comparison itself, without torch -----------------------------------


def _desc(rank: int, **change: Any) -> dict[str, Any]:
    args = {"batch_size": 4, "num_shards": 2, "random_shuffle": True, "shuffle": "permute", "seed": 12, "initial_fill": 1024,
            "pad_last_batch": True, "stick_to_shard": False}
    ds, fp = change.pop("dataset", ("train", "a" * 32))
    shard = change.pop("shard_id", rank)
    args.update(change)
    return {"rank": rank, "dataset": ds, "fingerprint": fp, "shard_id": shard, "terms": terms(args)}


@pytest.mark.parametrize("ranks, want", [
    ([_desc(0), _desc(1)], []),
    ([_desc(0), _desc(1, seed=13)], ["seed: 12 on rank 0; 13 on rank 1"]),
    ([_desc(0, seed=1), _desc(1, seed=2), _desc(2, seed=1, num_shards=3, shard_id=0)],
     ["num_shards: 2 on ranks 0, 1; 3 on rank 2", "seed: 1 on ranks 0, 2; 2 on rank 1", "shard_id 0 on ranks 0, 2: they read the same samples"]),
    ([_desc(0, random_shuffle=False, seed=1), _desc(1, random_shuffle=False, seed=2)], []),  # unshuffled seeds change nothing
    ([_desc(0, random_shuffle=False), _desc(1, seed=99)], ["random_shuffle: False on rank 0; True on rank 1"]),
    ([_desc(0, initial_fill=1), _desc(1, initial_fill=2)], []),  # permute has no buffer
    # DALI's shuffle: shards are fixed ranges of a seedless order, so DALI's own
    # seed=12+local_rank and buffer sizes change no rank's samples
    ([_desc(0, shuffle="dali", initial_fill=1, seed=12), _desc(1, shuffle="dali", initial_fill=2, seed=13)], []),
    ([_desc(0), _desc(1, dataset=("val", "b" * 32))],
     [f"dataset: ('train' (fingerprint {'a' * 32})) on rank 0; ('val' (fingerprint {'b' * 32})) on rank 1"]),
    ([_desc(0), _desc(1, dataset=("copy", "a" * 32))], []),  # another name, the same files
    ([_desc(0, num_shards=4), _desc(1, num_shards=4)], ["num_shards 4 with 2 ranks in the group: shards 2, 3 read by no rank (never seen)"]),
    ([_desc(0), {"rank": 1, "error": "NotFoundError: unknown dataset"}], ["rank 1 could not open its source (NotFoundError: unknown dataset)"]),
])
def test_disagreements(ranks: list[dict[str, Any]], want: list[str]) -> None:
    got = [re.sub(r"'(\w+)' \(fingerprint (\w+)\)", r"('\1' (fingerprint \2))", g) for g in disagreements(ranks)]
    assert got == want


class _FakeDist:
    """torch.distributed as far as Peers uses it: the other ranks' answers
    are given."""

    def __init__(self, others: list[dict[str, Any]]) -> None:
        self.others, self.calls = others, 0

    def all_gather_object(self, out: list[Any], mine: Any, group: Any = None) -> None:
        self.calls += 1
        out[:] = [mine] + self.others


def test_peers_raise_on_every_rank_and_pass_errors_on() -> None:
    dist = _FakeDist([_desc(1, seed=13)])
    p = Peers(dist, None, 2, 0)
    with pytest.raises(RankMismatchError, match=r"ranks disagree \(torch.distributed, 2 ranks, this is rank 0\): seed: 12 on rank 0; 13 on rank 1"):
        p.compare("train", "a" * 32, 0, {"batch_size": 4, "num_shards": 2, "random_shuffle": True, "shuffle": "permute",
                                          "seed": 12, "initial_fill": 1024, "pad_last_batch": True, "stick_to_shard": False})
    p.fail(ValueError("bad"))
    assert dist.calls == 2


def test_no_collective_without_torch_distributed() -> None:
    """No torch imported (or not initialised, or unsharded, or turned off):
    no comparison, and torch is not imported for it."""
    had = "torch" in sys.modules
    assert peers(2, None, True) is None or had
    assert peers(1, None, True) is None and peers(2, None, False) is None
    assert ("torch" in sys.modules) == had


# --- torch.distributed, two real processes ----------------------------------

_RANK = textwrap.dedent("""
    import json, os, sys
    import torch.distributed as dist
    from nvfeed import LoaderSource
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method=os.environ["INIT"], rank=rank, world_size=2)
    sock = os.environ["SOCK"]
    kw = dict(batch_size=4, num_shards=2, random_shuffle=True, seed=12)
    steps = {
        "agree": dict(shard_id=rank),
        "seed": dict(shard_id=rank, seed=12 + rank),  # DALI's example: seed=12+local_rank
        "num_shards": dict(shard_id=rank, num_shards=2 + rank),
        "duplicate": dict(shard_id=0),
        "batch_size": dict(shard_id=rank, batch_size=4 * (1 + rank)),
        "shuffle": dict(shard_id=rank, shuffle=("permute", "dali")[rank]),
        "dataset": dict(shard_id=rank, dataset=("train", "val")[rank]),
        "open fails": dict(shard_id=rank, dataset=("train", "nope")[rank]),
        "bad argument": dict(shard_id=(0, 7)[rank]),
        "unread shards": dict(shard_id=rank, num_shards=4),
        "unchecked": dict(shard_id=rank, seed=12 + rank, check_ranks=False),
    }
    out = {}
    for name, change in steps.items():
        args = {**kw, **change}
        ds = args.pop("dataset", "train")
        try:
            with LoaderSource(ds, socket=sock, **args) as src:
                out[name] = ["ok", src.fingerprint, len(next(src)[0])]
        except Exception as e:
            out[name] = [type(e).__name__, str(e)]
    if rank == 0:  # unsharded, on one rank only: no collective, no wait
        with LoaderSource("train", socket=sock, batch_size=4) as src:
            out["rank 0 only"] = ["ok", src.fingerprint, len(next(src)[0])]
    dist.barrier()
    print(json.dumps(out))
""")


def _torch() -> None:
    """Skips unless torch imports in this venv (the torch helper installs it)."""
    try:
        import torch.distributed as dist  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means no torch here
        pytest.skip(f"torch is not importable in this venv ({e!r}): the torch.distributed test needs it")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this torch build")


def test_torch_distributed_two_ranks(two: Daemon) -> None:
    """Two processes in a gloo group, one source each per step: the ranks
    that disagree raise RankMismatchError on both ranks naming the argument
    and each rank's value; a rank whose open or argument fails raises its
    own error and the other one names it; agreeing ranks read."""
    _torch()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "INIT": f"tcp://127.0.0.1:{port}", "SOCK": two.socket,
           "PYTHONPATH": str(REPO / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [subprocess.Popen([sys.executable, "-c", _RANK], env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = []
    for p in procs:
        o, e = p.communicate(timeout=300)
        assert p.returncode == 0, e
        outs.append(json.loads(o.strip().splitlines()[-1]))
    r0, r1 = outs
    assert r0["agree"][0] == r1["agree"][0] == "ok" and r0["agree"][1] == r1["agree"][1]
    for name, said in [("seed", "seed: 12 on rank 0; 13 on rank 1"),
                       ("num_shards", "num_shards: 2 on rank 0; 3 on rank 1"),
                       ("duplicate", "shard_id 0 on ranks 0, 1: they read the same samples"),
                       ("batch_size", "batch_size: 4 on rank 0; 8 on rank 1"),
                       ("shuffle", "shuffle: 'permute' on rank 0; 'dali' on rank 1"),
                       ("dataset", "dataset: 'train' (fingerprint "),
                       ("unread shards", "num_shards 4 with 2 ranks in the group: shards 2, 3 read by no rank")]:
        for r, out in enumerate(outs):
            assert out[name][0] == "RankMismatchError", (name, r, out[name])
            assert said in out[name][1] and f"this is rank {r}" in out[name][1], (name, r, out[name][1])
    assert r1["open fails"][0] == "NotFoundError" and 'unknown dataset "nope"' in r1["open fails"][1]
    assert r0["open fails"][0] == "RankMismatchError" and "rank 1 could not open its source (NotFoundError: " in r0["open fails"][1]
    assert r1["bad argument"][0] == "ValueError" and "shard_id must be an int in [0, 1]" in r1["bad argument"][1]
    assert r0["bad argument"][0] == "RankMismatchError" and "rank 1 could not open its source (ValueError: shard_id" in r0["bad argument"][1]
    assert r0["unchecked"][0] == r1["unchecked"][0] == "ok"
    assert r0["rank 0 only"][0] == "ok"


def test_content_differences_named() -> None:
    """Ranks' content summaries: the first chunk that differs is named,
    with each side's first sample there; a rank whose daemon gives none
    is left out, with a warning where others give one."""
    from nvfeed import _content

    def summary(sizes: list[int]) -> dict[str, object]:
        chunks = "".join(f"{s:016x}" for s in sizes)
        return {"samples": len(sizes), "labels": 1, "digest": hashlib.md5(chunks.encode()).hexdigest(), "chunks": chunks,
                "names": [f"c0/{i:02d}.jpg" for i in range(len(sizes))], "sizes": sizes, "first_labels": [0] * len(sizes)}

    a, b = summary([10, 11, 12]), summary([10, 11, 13])
    got = _content.differences("train", [{"rank": 0, "content": a}, {"rank": 1, "content": b}, {"rank": 2, "content": a}])
    assert got == ["rank 1's copy of dataset 'train' is not rank 0's: sample 2 differs; rank 1's first there is "
                   "\"c0/02.jpg\" (13 bytes, label 0); rank 0's first there is \"c0/02.jpg\" (12 bytes, label 0)"]
    assert _content.differences("train", [{"rank": 0, "content": a}, {"rank": 1, "content": summary([10, 11])}]) == [
        "rank 1's copy of dataset 'train' is not rank 0's: rank 1's copy has 2 samples, rank 0's 3"]
    with pytest.warns(RuntimeWarning, match=r"ranks \[1\] give no content summary"):
        assert _content.differences("train", [{"rank": 0, "content": a}, {"rank": 1, "content": None}]) == []
