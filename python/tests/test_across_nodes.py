# SPDX-License-Identifier: Apache-2.0
"""Two nodes, each its own daemon over its own copy of the datasets: the
same files on an ext4 and on an xfs loop device (other extents), each
mapped by its own mkbmap. Ranks agree on a dataset by its content (names,
sizes, labels), not its layout: a two-rank gloo run (rank r through
daemon r) reads the copies alike; a copy with one file changed (another
size, renamed, moved to another class) is refused on every rank with
RankMismatchError naming that file; a resume state taken on node A
resumes on node B's same copy and is refused on a copy that differs.
For class folders, numpy files and WebDataset tars."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from conftest import BIN, Daemon, skip_unprivileged, start_daemon, stop_daemon
from nvfeed import RankMismatchError

torch = pytest.importorskip("torch")

N = 24
"""Samples a dataset: fewer than 64, so each chunk of the content is one
sample and a difference names the very file."""

KINDS = {"train": [], "npy": ["--reader", "numpy"], "wds": ["--reader", "webdataset"]}
"""The datasets, by name, and how mkbmap maps each."""

KW: dict[str, dict[str, Any]] = {"train": {}, "npy": {}, "wds": {"ext": ["jpg", "cls"]}}
"""LoaderDataset's arguments for each kind."""


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def _images(root: Path) -> None:
    """Class folders c0, c1, c2 of N files of distinct sizes."""
    rng = np.random.default_rng(3)
    for i in range(N):
        p = root / "train" / f"c{i % 3}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.integers(0, 255, 5000 + 397 * i, dtype=np.uint8).tobytes())


def _arrays(root: Path) -> None:
    """N .npy files of one shape and dtype."""
    (root / "npy").mkdir(parents=True)
    for i in range(N):
        np.save(root / "npy" / f"{i:03d}.npy", np.arange(i, i + 600, dtype=np.float32).reshape(30, 20))


def _tar(path: Path, grow: str = "") -> None:
    """A tar of N/2 samples, each a .jpg and a .cls; the .jpg of key
    ``grow`` a byte longer."""
    rng = np.random.default_rng(int(path.stem[-1]))
    with tarfile.open(path, "w") as t:
        for j in range(N // 2):
            key = f"k{path.stem[-1]}{j:03d}"
            for ext, data in (("jpg", rng.integers(0, 255, 900 + 131 * j, dtype=np.uint8).tobytes()),
                              ("cls", str(j % 5).encode())):
                if key == grow and ext == "jpg":
                    data += b"!"
                ti = tarfile.TarInfo(f"{key}.{ext}")
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))


def _shards(root: Path) -> None:
    (root / "wds").mkdir(parents=True)
    for s in range(2):
        _tar(root / "wds" / f"part-{s}.tar")


def _move(src: str, dst: str) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        (root / dst).parent.mkdir(parents=True, exist_ok=True)
        os.rename(root / src, root / dst)
    return edit


def _grow(name: str) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        with open(root / name, "ab") as f:
            f.write(b"\0" * 100)
    return edit


def _reshape(root: Path) -> None:
    np.save(root / "npy" / "007.npy", np.zeros((31, 20), dtype=np.float32))


def _at(who: str, name: str, size: int, label: int = -1) -> str:
    """A pattern of the sample a refusal names as ``who``'s."""
    what = f"{size} bytes" if label < 0 else f"{size} bytes, label {label}"
    return re.escape(f'{who} first there is "{name}" ({what})')


VARIANTS: dict[str, tuple[str, Callable[[Path], None], str]] = {
    # name: (kind, the change made to copy B, what the refusal names)
    "size": ("train", _grow("train/c1/007.jpg"),
             _at("rank 1's", "c1/007.jpg", 7879, 1) + "; " + _at("rank 0's", "c1/007.jpg", 7779, 1)),
    "renamed": ("train", _move("train/c1/007.jpg", "train/c1/007x.jpg"),
                _at("rank 1's", "c1/007x.jpg", 7779, 1) + "; " + _at("rank 0's", "c1/007.jpg", 7779, 1)),
    "relabelled": ("train", _move("train/c1/007.jpg", "train/c2/007.jpg"), _at("rank 0's", "c1/007.jpg", 7779, 1)),
    "npy-size": ("npy", _reshape, _at("rank 1's", "007.npy", 2480)),
    "npy-renamed": ("npy", _move("npy/007.npy", "npy/007b.npy"), _at("rank 1's", "007b.npy", 2400)),
    "wds-size": ("wds", lambda root: _tar(root / "wds" / "part-0.tar", grow="k0007"),
                 _at("rank 1's", "part-0.tar/k0007.{jpg,cls}", 1819)),
}


@dataclass
class Node:
    mnt: Path
    loop: str
    daemon: Daemon


def _fs(work: Path, fstype: str) -> tuple[Path, str]:
    """A fresh fstype filesystem on a loop device, mounted at work/mnt."""
    img, mnt = work / "img", work / "mnt"
    with open(img, "wb") as f:
        f.truncate(320 << 20)  # xfs's smallest
    _run(f"mkfs.{fstype}", "-q", *(["-F"] if fstype == "ext4" else ["-f"]), str(img))
    loop = _run("losetup", "--find", "--show", str(img))
    mnt.mkdir()
    _run("mount", loop, str(mnt))
    return mnt, loop


def _map(root: Path, kind: str, out: Path) -> Path:
    subprocess.run([str(BIN / "mkbmap"), *KINDS[kind], "--mountpoint", str(root), "-o", str(out)], check=True,
                   capture_output=True)
    return out


def _serve(work: Path, maps: dict[str, Path]) -> Daemon:
    extra = [a for name, m in maps.items() if name != "train" for a in ("--dataset", f"{name}={m}")]
    return start_daemon(work, maps["train"], *extra)


def _first_blocks(root: Path) -> list[str]:
    """Each file's first physical block under root (FIEMAP, by filefrag)."""
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file():
            m = re.search(r"^\s*0:\s+\d+\.\.\s*\d+:\s+(\d+)\.\.", _run("filefrag", "-v", "-b4096", str(p)), re.M)
            out.append(f"{p.relative_to(root)}@{m.group(1) if m else '?'}")
    return out


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, Node]]:
    if os.geteuid() != 0 or not shutil.which("losetup") or not shutil.which("mkfs.xfs"):
        skip_unprivileged("two nodes need root, loop devices and mkfs.xfs")
    if not (BIN / "loaderd").exists():
        skip_unprivileged("bin/loaderd missing: build the binaries first")
    made: list[Node] = []
    mounts: list[tuple[Path, str]] = []
    try:
        a_work, b_work = tmp_path_factory.mktemp("nodeA"), tmp_path_factory.mktemp("nodeB")
        a, b = _fs(a_work, "ext4"), _fs(b_work, "xfs")
        mounts += [a, b]
        for fill in (_images, _arrays, _shards):
            fill(a[0] / "base")
        shutil.copytree(a[0] / "base", b[0] / "base")
        for name, (kind, edit, _) in VARIANTS.items():
            shutil.copytree(a[0] / "base" / kind, b[0] / name / kind)
            edit(b[0] / name)
        os.sync()
        assert _first_blocks(a[0] / "base") != _first_blocks(b[0] / "base"), "the two copies share a layout"
        a_maps = {k: _map(a[0] / "base" / k, k, a_work / f"{k}.bmap") for k in KINDS}
        b_maps = {k: _map(b[0] / "base" / k, k, b_work / f"{k}.bmap") for k in KINDS}
        for name, (kind, _, _) in VARIANTS.items():
            a_maps[name] = a_maps[kind]  # node A: the dataset as it was
            b_maps[name] = _map(b[0] / name / kind, kind, b_work / f"{name}.bmap")
        made.append(Node(a[0], a[1], _serve(a_work, a_maps)))
        made.append(Node(b[0], b[1], _serve(b_work, b_maps)))
        yield made[0], made[1]
    finally:
        for n in made:
            assert stop_daemon(n.daemon) == 0, n.daemon.log.read_text()
        for mnt, loop in mounts:
            if subprocess.run(["umount", str(mnt)]).returncode != 0:
                subprocess.run(["umount", "-l", str(mnt)])
            subprocess.run(["losetup", "-d", loop])


def _digests(node: Node, kind: str) -> list[str]:
    """Each sample's digest as content_ranks.py takes it, from node's files."""
    root = node.mnt / "base" / kind
    if kind == "train":
        return [hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in root.rglob("*.jpg")]
    if kind == "npy":
        return [hashlib.sha256(np.load(p).tobytes()).hexdigest()[:16] for p in root.glob("*.npy")]
    out = []
    for t in root.glob("*.tar"):
        with tarfile.open(t) as tf:
            out += [hashlib.sha256(tf.extractfile(m).read()).hexdigest()[:16]  # type: ignore[union-attr]
                    for m in tf.getmembers() if m.name.endswith(".jpg")]
    return out


def _case(name: str, kind: str, a: Node, b: Node) -> dict[str, Any]:
    return {"name": name, "dataset": name, "sockets": [a.daemon.socket, b.daemon.socket], "kw": KW[kind],
            "numpy": kind == "npy"}


def test_two_ranks_two_nodes(nodes: tuple[Node, Node], tmp_path: Path) -> None:
    """torchrun, two gloo ranks, rank r through node r's daemon: the same
    files on ext4 and xfs are one dataset (every sample once across the
    ranks); a copy with one file changed fails on both ranks, naming it."""
    a, b = nodes
    cases = [_case(k, k, a, b) for k in KINDS] + [_case(n, v[0], a, b) for n, v in VARIANTS.items()]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(Path(__file__).parent / "content_ranks.py"), str(tmp_path), json.dumps(cases)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    for k in KINDS:
        got = [rk[k] for rk in ranks]
        assert all("samples" in g for g in got), got
        assert sorted(got[0]["samples"] + got[1]["samples"]) == sorted(_digests(a, k)), f"{k}: not every sample once"
    for name, (_, _, names) in VARIANTS.items():
        for i, rk in enumerate(ranks):
            g = rk[name]
            assert g.get("error") == "RankMismatchError", f"{name}, rank {i}: {g}"
            assert re.search(rf"rank 1's copy of dataset '{name}' is not rank 0's: .*{names}", g["message"]), g["message"]


def _epoch_rest(name: str, kind: str, sock: str, state: Any = None, take: int = 0) -> tuple[list[str], Any]:
    """The digests of an epoch's batches after ``take`` of them (resumed
    at ``state``), and the state_dict() taken after ``take``."""
    from nvfeed.torch import LoaderDataset

    ds = LoaderDataset(name, socket=sock, batch_size=4, random_shuffle=True, seed=3, shard_id=0, num_shards=1,
                       **KW[kind])
    try:
        if state is not None:
            ds.load_state_dict(state)
        it = iter(ds)
        for _ in range(take):
            next(it)
        sd = ds.state_dict()
        out = []
        for batch in it:
            for s in (batch.unbind(0) if kind == "npy" else batch[0]):
                data = s.numpy().tobytes() if isinstance(s, torch.Tensor) else bytes(s)
                out.append(hashlib.sha256(data).hexdigest()[:16])
        return out, sd
    finally:
        ds.close()


@pytest.mark.parametrize("name", [*KINDS, *VARIANTS])
def test_state_from_another_node(nodes: tuple[Node, Node], name: str) -> None:
    """A state_dict() taken on node A resumes on node B's copy when its
    content is the same (the same batches follow), and is refused with
    RankMismatchError naming the file where it differs."""
    a, b = nodes
    kind, _, names = VARIANTS.get(name, (name, None, ""))
    rest, sd = _epoch_rest(name, kind, a.daemon.socket, take=2)
    assert sd["state"]["content"]["samples"] == N and len(sd["state"]["content"]["chunks"]) == 16 * N
    if name in KINDS:
        assert _epoch_rest(name, kind, b.daemon.socket, state=sd)[0] == rest
        return
    with pytest.raises(RankMismatchError, match=r"is not the copy the state was taken on: .*"
                       + names.replace(re.escape("rank 1's"), re.escape("this node's"))
                       .replace(re.escape("rank 0's"), re.escape("the state's"))) as e:
        _epoch_rest(name, kind, b.daemon.socket, state=sd)
    assert e.value.error_code == "rank_mismatch"
