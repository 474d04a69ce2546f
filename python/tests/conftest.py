# SPDX-License-Identifier: Apache-2.0
"""Fixtures: a dataset of real JPEGs on a real filesystem, its block map,
and a real `loaderd serve` on a unix socket."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / "bin"


@dataclass
class Dataset:
    root: Path
    bmap: Path
    files: list[tuple[str, int]]  # (relative path, label) in DALI order
    by_hash: dict[str, tuple[str, int]]
    raw: bool  # the gds and bam backends can run


@dataclass
class Daemon:
    socket: str
    proc: subprocess.Popen
    log: Path


REQUIRE_VAR = "NVFEED_REQUIRE_PRIVILEGED"


# How long a test waits for background work (a daemon starting, a
# checking pass, a watch event) before it fails: far above what it takes
# on an idle machine, since a loaded one stretches it many times. Tests
# wait on progress with it, never on a fixed sleep.
WAIT = 120.0


def wait_until(cond: "Callable[[], bool]", what: str, timeout: float = WAIT) -> None:
    """Poll ``cond`` until it holds; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not after {timeout:.0f} s"
        time.sleep(0.02)


def skip_unprivileged(reason: str) -> None:
    """Skips a test that needs what this machine lacks (root, loop devices,
    a block map), or fails it where NVFEED_REQUIRE_PRIVILEGED=1 says the
    machine has them all (.ci/run sets it): a CI that lost its loop
    devices goes red, not green."""
    if os.environ.get(REQUIRE_VAR) == "1":
        pytest.fail(f"{reason} ({REQUIRE_VAR}=1: this machine must run the test, not skip it)")
    pytest.skip(reason)


def need_raw(dataset: "Dataset", backend: str) -> None:
    """Skips (see skip_unprivileged) a raw backend that cannot read here."""
    if backend != "file" and not dataset.raw:
        skip_unprivileged(f"{backend} needs read access to the block device (run as root)")


def _jpeg(rng: np.random.Generator, w: int, h: int) -> bytes:
    from PIL import Image
    img = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=90)
    return out.getvalue()


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="session")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    if not (BIN / "loaderd").exists():
        skip_unprivileged("bin/loaderd missing: run `make test` (it builds the binaries first)")
    work = tmp_path_factory.mktemp("ds")
    mnt, loop = work / "mnt", None
    if os.geteuid() == 0 and shutil.which("losetup"):
        img = work / "img"
        with open(img, "wb") as f:
            f.truncate(256 << 20)
        _run("mkfs.ext4", "-q", "-F", "-b", "4096", str(img))
        loop = _run("losetup", "--find", "--show", "--direct-io=on", str(img))
        mnt.mkdir()
        _run("mount", loop, str(mnt))
    root = mnt / "train"
    rng = np.random.default_rng(7)
    classes = ["Bird", "cat", "dog", "Écureuil"]  # bytewise order: B < c < d < É
    for c in classes:
        (root / c).mkdir(parents=True)
    for i in range(45):
        c = classes[i % len(classes)]
        ext = ".JPG" if i % 5 == 0 else ".jpg"
        (root / c / f"img{i:03d}{ext}").write_bytes(_jpeg(rng, 32 + i % 7, 24 + i % 5))
    (root / "cat" / "notes.txt").write_text("not a sample")
    os.sync()
    files = []
    for label, c in enumerate(sorted(os.listdir(root), key=os.fsencode)):
        for f in sorted(os.listdir(root / c), key=os.fsencode):
            if f.lower().endswith(".jpg"):
                files.append((f"{c}/{f}", label))
    by_hash = {hashlib.sha256((root / p).read_bytes()).hexdigest(): (p, lbl) for p, lbl in files}
    bmap = work / "train.bmap"
    r = subprocess.run([str(BIN / "mkbmap"), "--mountpoint", str(root), "-o", str(bmap)], capture_output=True, text=True)
    raw = r.returncode == 0
    if not raw:  # a filesystem without FIEMAP device offsets: file backend only
        print(f"mkbmap refused the test filesystem ({r.stderr.strip()}): gds and bam tests will skip")
        skip_unprivileged("no block map could be made here")
    yield Dataset(root=root, bmap=bmap, files=files, by_hash=by_hash, raw=loop is not None or os.geteuid() == 0)
    if loop:
        if subprocess.run(["umount", str(mnt)]).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)])  # still busy (a test's leftover process): detach anyway
        subprocess.run(["losetup", "-d", loop])


def small_dataset(parent: Path, name: str) -> tuple[Path, Path, dict[str, str]]:
    """Two classes of random 'JPEGs' next to the shared dataset (same
    filesystem); returns the root, its map and sha256 -> path."""
    root = parent / name
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    by_hash = {}
    for i in range(30):
        p = root / f"c{i % 2}" / f"{i:02d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        data = rng.integers(0, 255, 3000 + 700 * i, dtype=np.uint8).tobytes()
        p.write_bytes(data)
        by_hash[hashlib.sha256(data).hexdigest()] = str(p.relative_to(root))
    os.sync()
    bmap = parent / f"{name}.bmap"
    subprocess.run([str(BIN / "mkbmap"), "--mountpoint", str(root), "-o", str(bmap)], check=True, capture_output=True)
    return root, bmap, by_hash


def faults_build() -> str:
    """The test build of loaderd (`-tags nvfeed_faults`: `serve --inject-eio`),
    bin/loaderd-faults, built here when `make test` has not."""
    exe = BIN / "loaderd-faults"
    if not exe.exists():
        go = shutil.which("go") or str(REPO / ".tools" / "go" / "bin" / "go")
        subprocess.run([go, "build", "-tags", "nvfeed_faults", "-o", str(exe), "./cmd/loaderd"], cwd=REPO, check=True)
    return exe.name


def start_daemon(tmp: Path, bmap: Path, *extra: str, binary: str = "loaderd",
                 env: Optional[dict[str, str]] = None, preexec_fn: Optional[Callable[[], None]] = None,
                 wrap: Sequence[str] = ()) -> Daemon:
    """Starts `bin/BINARY serve` on a socket in tmp with dataset train (env:
    variables added to this process's environment; preexec_fn: run in the
    child before it execs, as subprocess.Popen's; wrap: a command line the
    daemon's is appended to, such as `unshare --mount ...`)."""
    sock = str(tmp / "loaderd.sock")
    log = tmp / "loaderd.log"
    proc = subprocess.Popen([*wrap, str(BIN / binary), "serve", "--socket", sock, "--dataset", f"train={bmap}", *extra],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                            preexec_fn=preexec_fn)
    deadline = time.monotonic() + WAIT
    while not os.path.exists(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"loaderd did not start: {log.read_text()}")
        time.sleep(0.02)
    return Daemon(socket=sock, proc=proc, log=log)


def stop_daemon(d: Daemon) -> int:
    d.proc.send_signal(signal.SIGTERM)
    return d.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def daemon(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Daemon:
    d = start_daemon(tmp_path_factory.mktemp("d"), dataset.bmap, "--session-timeout", "2s")
    yield d
    code = stop_daemon(d)
    assert code == 0, f"loaderd exited {code}: {d.log.read_text()}"
    assert not os.path.exists(d.socket), "socket left behind after SIGTERM"


@dataclass
class Wheel:
    path: Path  # dist/nvfeed-VERSION-....whl
    site: Path  # where it is installed (pip --target): site/bin has loaderd and mkbmap
    build_stderr: str


@pytest.fixture(scope="session")
def wheel() -> Iterator[Wheel]:
    """`make wheel`'s script run with a bare environment (Go, the system's
    python3, no venv on PATH), and the wheel pip-installed offline into a
    directory every user can read (the operator test runs its client as
    nobody)."""
    go = shutil.which("go") or str(REPO / ".tools" / "go" / "bin" / "go")
    env = {"PATH": f"{os.path.dirname(go)}:/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    r = subprocess.run(["bash", str(REPO / "scripts" / "wheel.sh")], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    path = Path(REPO / r.stdout.strip().splitlines()[-1])
    base = Path(tempfile.mkdtemp(prefix="nvfeed-wheel-"))
    base.chmod(0o755)
    site = base / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(path)],
                   check=True)
    for d, _, _ in os.walk(base):
        os.chmod(d, 0o755)
    try:
        yield Wheel(path, site, r.stderr)
    finally:
        shutil.rmtree(base)
