# SPDX-License-Identifier: Apache-2.0
"""Resume on another number of ranks (docs/resume.md), CPU, gloo, a real
loaderd: torchrun runs of resume_ranks.py read images, a file list, tensors and a
WebDataset at once, are killed in the middle of epoch 1 and resumed from
rank 0's checkpoint with fewer ranks (4, then 3, then 2), with the same
batch size or others; and an elastic job (torchrun agents as nodes)
loses a node mid-epoch, then gains one. Every epoch's samples are each
dataset's exactly once: none missing, none twice."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from conftest import BIN, WAIT, Daemon, Dataset, start_daemon, stop_daemon, wait_until
from nvfeed.torch import LoaderDataset
from nvfeed import LoaderError, LoaderSource

RANKS = Path(__file__).parent / "resume_ranks.py"
SIZES = {"imgs": 203, "tens": 211, "wds": 197}


@dataclass
class Sets:
    daemon: Daemon
    want: dict[str, collections.Counter[str]]  # kind -> each sample's id, once


def _id(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _mkbmap(root: Path, out: Path, reader: str) -> str:
    r = subprocess.run([str(BIN / "mkbmap"), "--reader", reader, "--mountpoint", str(root), "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return str(out)


@pytest.fixture(scope="module")
def sets(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sets]:
    # Its own folder on the dataset's filesystem: each module that uses the fixture makes its own.
    base, work = Path(tempfile.mkdtemp(prefix="resume-", dir=dataset.root.parent)), tmp_path_factory.mktemp("resume")
    rng = np.random.default_rng(47)
    want: dict[str, collections.Counter[str]] = {k: collections.Counter() for k in SIZES}
    for i in range(SIZES["imgs"]):
        p = base / "imgs" / f"c{i % 3}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        data = rng.integers(0, 255, 100 + i, dtype=np.uint8).tobytes()
        p.write_bytes(data)
        want["imgs"][_id(data)] += 1
    for i in range(SIZES["tens"]):
        a = np.full(4, i, dtype=np.int32)
        (base / "tens").mkdir(parents=True, exist_ok=True)
        np.save(base / "tens" / f"{i:03d}.npy", a)
        want["tens"][_id(a.tobytes())] += 1
    (base / "wds").mkdir(parents=True)
    for s in range(3):
        with tarfile.open(base / "wds" / f"part-{s}.tar", "w") as t:
            for j in range(s * 66, min((s + 1) * 66, SIZES["wds"])):
                for ext, data in ((".bin", f"sample {j}".encode() * 3), (".cls", str(j % 4).encode())):
                    info = tarfile.TarInfo(f"k{j:03d}{ext}")
                    info.size = len(data)
                    t.addfile(info, __import__("io").BytesIO(data))
                want["wds"][_id(f"sample {j}".encode() * 3)] += 1
    # A file list: every other image, in reverse, each with a label of its own.
    listed = sorted((base / "imgs").rglob("*.jpg"))[::-2]
    (base / "list.txt").write_text("".join(f"{p.relative_to(base / 'imgs')} {i % 5}\n" for i, p in enumerate(listed)))
    want["list"] = collections.Counter(_id(p.read_bytes()) for p in listed)
    os.sync()
    maps = [("imgs", "file"), ("tens", "numpy"), ("wds", "webdataset")]
    extra = [a for k, r in maps for a in ("--dataset", f"{k}={_mkbmap(base / k, work / f'{k}.bmap', r)}")]
    r = subprocess.run([str(BIN / "mkbmap"), "--file-list", str(base / "list.txt"), "--mountpoint", str(base / "imgs"),
                        "-o", str(work / "list.bmap")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    extra += ["--dataset", f"list={work / 'list.bmap'}"]
    # A killed run leaves its sessions open until the timeout: room for several runs.
    d = start_daemon(work, dataset.bmap, "--session-timeout", "5s", "--max-sessions-per-uid", "128",
                     "--max-conns-per-uid", "256", *extra)
    try:
        yield Sets(d, want)
    finally:
        assert stop_daemon(d) == 0, d.log.read_text()[-3000:]


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))


def _torchrun(sets: Sets, out: Path, ranks: int, batch: int, epochs: int, crash: int, pad: bool) -> str:
    """A torchrun of resume_ranks.py: "ok", "killed" (the crash) or its log's tail."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), str(RANKS),
           sets.daemon.socket, str(out), str(batch), str(epochs), str(crash), "1" if pad else "0"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env())
    (out / f"torchrun-{ranks}.log").write_text(r.stdout + r.stderr)
    if r.returncode == 0:
        return "ok"
    # The crash is the last rank's SIGKILL, which it marks first; the other
    # ranks may print tracebacks as their peer vanishes.
    return "killed" if "Signal 9 (SIGKILL)" in r.stderr and (out / f"killed-w{ranks}").exists() else \
        (r.stdout + r.stderr)[-4000:]


def _check(sets: Sets, out: Path, epochs: int) -> list[dict]:
    """Every epoch held each dataset's samples once, counting the steps a
    checkpoint committed; returns their records."""
    commits = {(c["run"], c["step"]) for c in (json.loads(p.read_text()) for p in (out / "ck").glob("*.json"))}
    recs = [r for r in (json.loads(line) for line in (out / "received.jsonl").read_text().splitlines()
                        if line.endswith("}")) if (r["run"], r["step"]) in commits]
    for kind, want in sets.want.items():
        for e in range(epochs):
            got = collections.Counter(i for r in recs if r["kind"] == kind and r["epoch"] == e for i in r["ids"])
            missing, twice = want - got, got - want
            assert not missing and not twice, (f"{kind} epoch {e}: {sum(missing.values())} samples missing, "
                                               f"{sum(twice.values())} extra")
    return recs


@pytest.mark.parametrize("batches,pad", [((8, 8, 8), False), ((8, 5, 12), True)], ids=["same-batch", "other-batches"])
def test_crash_resume_on_fewer_ranks(sets: Sets, tmp_path: Path, batches: tuple[int, int, int], pad: bool) -> None:
    """4 ranks killed at epoch 1 batch 2, resumed on 3 ranks killed two
    batches later, resumed on 2 ranks to the end of epoch 2."""
    assert _torchrun(sets, tmp_path, 4, batches[0], 3, 2, pad) == "killed"
    assert _torchrun(sets, tmp_path, 3, batches[1], 3, 5, pad) == "killed"
    assert _torchrun(sets, tmp_path, 2, batches[2], 3, -1, pad) == "ok"
    recs = _check(sets, tmp_path, 3)
    worlds = {r["run"].split("b")[0] for r in recs if r["epoch"] == 1}
    assert worlds == {"w4", "w3", "w2"}, f"epoch 1 was read by {worlds}, want every run"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tree(pid: int) -> list[int]:
    """pid and its descendants (torchrun starts its workers in sessions of
    their own: a process group does not hold them)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            children[int(stat.rsplit(")", 1)[1].split()[1])].append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _kill_tree(p: subprocess.Popen[bytes]) -> None:
    for pid in _tree(p.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait()


def test_elastic_shrinks_then_grows(sets: Sets, tmp_path: Path) -> None:
    """The elastic job below. After losing a node, the surviving agent's
    next round sometimes had its workers wait for ever in gloo's
    connection of the ranks (connectFullMesh, which keeps to no timeout;
    3 of 5 attempts in two CI runs, the agent logging nothing more):
    resume_ranks.py's watchdog now ends such a worker after INIT_LIMIT and
    the agent forms the next round. An attempt that still makes no
    progress is given up with a warning and the job run again, at most 4
    times (one CI run needed 3: the agent itself hung in its rendezvous,
    which the workers' watchdog cannot end). Each attempt that gets
    through is checked whole."""
    for attempt in range(4):
        if _elastic(sets, tmp_path / f"attempt{attempt}"):
            return
        warnings.warn(f"attempt {attempt}: torchrun's surviving agent made no progress after losing a node "
                      "(its rendezvous hung): running the job again")
    pytest.fail("torchrun's surviving agent hung in its rendezvous after losing a node, 4 times")


def _elastic(sets: Sets, tmp_path: Path) -> bool:
    """torchrun elastic (c10d rendezvous on localhost, agents of 2
    processes as nodes): of a job of 2 agents, one is killed in epoch 1
    and the job restarts on 2 ranks; that agent is killed too, and the job
    comes back as 2 new agents (4 ranks) that resume from its checkpoint.
    Every epoch once; False when the surviving agent hung. (An agent joining a running job is not tested: with
    every agent on one host, torch 2.14's rendezvous round after a join
    hangs waiting for the round's store, MASTER_ADDR.)"""
    # Every agent runs 2 workers: their ranks follow from the agent's
    # (TORCH_ELASTIC_WORKER_IDENTICAL), without the role exchange through
    # the round's store.
    tmp_path.mkdir()
    env = dict(_env(), RESUME_STEP_SLEEP="0.2", TORCH_ELASTIC_WORKER_IDENTICAL="1", LOGLEVEL="INFO")

    def agent(name: str, job: str, port: int) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:3", "--nproc_per_node", "2",
               "--max-restarts", "5", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-id", job, "--rdzv-conf", "last_call_timeout=2,join_timeout=120,is_host=false",
               "--monitor-interval", "0.2",
               str(RANKS), sets.daemon.socket, str(tmp_path), "4", "3", "-1", "0"]
        return subprocess.Popen(cmd, stdout=open(tmp_path / f"agent-{name}.log", "w"), stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)

    def worlds() -> list[tuple[str, int, int]]:
        """Each record's world ("w4"), epoch and step."""
        p = tmp_path / "received.jsonl"
        if not p.exists():
            return []
        recs = [json.loads(line) for line in p.read_text().splitlines() if line.endswith("}")]
        return [(r["run"].split("b")[0], r["epoch"], r["step"]) for r in recs]

    def store(port: int) -> Any:
        """The job's rendezvous store, hosted here (is_host=false in the
        agents): killing an agent never kills it, which hung the others."""
        from torch.distributed import TCPStore
        return TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)

    agents: list[subprocess.Popen[bytes]] = []
    try:
        port = _free_port()
        stores = [store(port)]
        agents.append(agent("a", "first", port))
        time.sleep(0.5)
        agents.append(agent("b", "first", port))
        # The waits below are for a rendezvous and a restart, slow on a busy machine: 3 WAITs each.
        wait_until(lambda: any(w == "w4" and e == 1 for w, e, _ in worlds()), "4 ranks in epoch 1", WAIT * 3)
        _kill_tree(agents[1])
        try:
            wait_until(lambda: len({k for w, _, k in worlds() if w == "w2"}) >= 3, "the job going on with 2 ranks",
                       WAIT * 2)
        except AssertionError:
            return False  # torch's rendezvous hung (above)
        _kill_tree(agents[0])
        port = _free_port()
        stores.append(store(port))
        agents.append(agent("c", "second", port))
        time.sleep(0.5)
        agents.append(agent("d", "second", port))
        for name, p in zip("cd", agents[2:]):
            assert p.wait(timeout=WAIT * 3) == 0, (tmp_path / f"agent-{name}.log").read_text()[-4000:]
    finally:
        for p in agents:
            _kill_tree(p)
    _check(sets, tmp_path, 3)
    seen = [w for w, _, _ in worlds()]
    first2, last4 = seen.index("w2"), len(seen) - 1 - seen[::-1].index("w4")
    assert first2 < last4 and seen[0] == "w4", f"the job did not go 4, 2, 4 ranks: {seen[0]}, {seen[first2]}"
    return True


def test_refused_where_not_exact(sets: Sets) -> None:
    """shuffle="dali" (each shard's own buffer order) cannot resume on
    other shards: the open says why and what to do."""
    kw = dict(socket=sets.daemon.socket, batch_size=4, random_shuffle=True, shuffle="dali")
    old = LoaderDataset("imgs", shard_id=0, num_shards=4, **kw)
    it = iter(old)
    next(it)
    sd = old.state_dict()
    new = LoaderDataset("imgs", shard_id=0, num_shards=2, **kw)
    new.load_state_dict(sd)
    with pytest.raises(LoaderError, match=r'shuffle="dali".*resume with the saved num_shards'):
        next(iter(new))


def test_loader_source_state_on_other_shards(sets: Sets) -> None:
    """LoaderSource(state=rank 0's state) on 3 shards, from 4 shards that
    each read 2 batches of 8 (batches of 5 now): the epoch's other
    samples, each once."""
    kw = dict(socket=sets.daemon.socket, random_shuffle=True, seed=3)
    got: list[str] = []
    for k in range(4):
        with LoaderSource("imgs", batch_size=8, shard_id=k, num_shards=4, **kw) as src:
            it = iter(src)
            for _ in range(2):
                got += [_id(s.tobytes()) for s in next(it)[0]]
            if k == 0:
                st = src.state()
    assert (st["epoch"], st["batch"]) == (0, 2)
    for k in range(3):
        with LoaderSource("imgs", batch_size=5, shard_id=k, num_shards=3, state=st, **kw) as src:
            assert src.state().get("stages") == [{"num_shards": 4, "batch_size": 8, "batch": 2}]
            got += [_id(s.tobytes()) for samples, _ in src for s in samples]
    assert collections.Counter(got) == sets.want["imgs"]
