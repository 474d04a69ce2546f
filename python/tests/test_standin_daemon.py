# SPDX-License-Identifier: Apache-2.0
"""The client of a real loaderd against the CUDA stand-in, daemon and
client in separate processes with different CUDA_VISIBLE_DEVICES (0,1 and
1,0): every sample's bytes, read back from the device by a slow consumer
"kernel" on the client's stream while the source releases each batch at
once (release_after=0, so the daemon reuses a slot as soon as the client
lets it), equal the file with that label, for file, gds and bam through
bounce and for cufile, two shards, two epochs, shuffled; the GPU named by
UUID; without the client's fence the same run reads wrong bytes (the race
is real); dense batches for batch_format="dali" where the samples share a
size; every process's report clean. (The lead's whole-flow suite may
fold these in.)"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

import standin
from conftest import BIN, Daemon, Dataset, start_daemon, stop_daemon
from nvfeed._cuda import LIB_DIR_ENV

TESTS = Path(__file__).resolve().parent
ROLES = str(TESTS / "standin_roles.py")


@pytest.fixture(scope="module")
def standin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return standin.build(tmp_path_factory.mktemp("cuda-standin"))


def _env(lib: Path, report: Path, visible: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "CUFILE_"))}
    env.update({LIB_DIR_ENV: str(lib), "CUDA_STANDIN_REPORT": str(report), "CUDA_VISIBLE_DEVICES": visible,
                "PYTHONPATH": str(TESTS.parent)})
    return env


class Daemons:
    """Starts loaderd on the stand-in (GPUs seen as 0,1), reports in
    tmp/report; stops what it started."""

    def __init__(self, standin_dir: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.standin_dir, self.tmp, self.mp = standin_dir, tmp, monkeypatch
        self.report = tmp / "report"
        self.started: list[Daemon] = []

    def start(self, bmap: Path) -> Daemon:
        with self.mp.context() as mp:
            for k, v in _env(self.standin_dir, self.report, "0,1").items():
                mp.setenv(k, v)
            work = self.tmp / f"d{len(self.started)}"
            work.mkdir()
            d = start_daemon(work, bmap)
        self.started.append(d)
        return d

    def stop_all(self) -> None:
        for d in self.started:
            if d.proc.poll() is None:
                assert stop_daemon(d) == 0, d.log.read_text()


@pytest.fixture
def daemons(standin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemons]:
    ds = Daemons(standin_dir, tmp_path, monkeypatch)
    try:
        yield ds
    finally:
        ds.stop_all()


def _client(ds: Daemons, d: Daemon, want: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """The client process (GPUs seen as 1,0)."""
    wf = ds.tmp / "want.json"
    wf.write_text(json.dumps(want))
    p = subprocess.run([sys.executable, ROLES, "flow", d.socket, str(wf), json.dumps(kw)],
                       env=_env(ds.standin_dir, ds.report, "1,0"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout, p.stderr, d.log.read_text())
    assert "VIOLATION" not in p.stderr, p.stderr
    r: dict[str, Any] = json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])
    return r


U1 = "GPU-5354414e-4449-4e2d-4750-552d30303031"  # physical GPU 1: the client's 0 (1,0), the daemon's 1 (0,1)


@pytest.mark.parametrize("backend,gpu_path", [("file", "bounce"), ("gds", "bounce"), ("bam", "bounce"),
                                              (None, "cufile")])
def test_every_sample_right_while_slots_are_reused(daemons: Daemons, dataset: Dataset, backend: Any,
                                                   gpu_path: str) -> None:
    if backend in ("gds", "bam") and not dataset.raw:
        pytest.skip(f"{backend} needs the block device")
    d = daemons.start(dataset.bmap)
    want = {h: [p, l] for h, (p, l) in dataset.by_hash.items()}
    kw: dict[str, Any] = {"batch_size": 5, "random_shuffle": True, "seed": 3, "gpu_path": gpu_path, "epochs": 2}
    if backend:
        kw["backend"] = backend
    for shard in range(2):
        r = _client(daemons, d, want, shard_id=shard, num_shards=2, **kw)
        assert r["samples"] >= 2 * 20, r
        assert r["bad"] == [], f"shard {shard}: samples read back wrong (the release raced the consumer?)"
        assert r["gpu_path"] == gpu_path
        assert r["uuid"] == U1 and r["daemon_device"] == 1  # the client's device 0, named by UUID
    daemons.stop_all()
    standin.assert_clean(daemons.report, 3)


def test_release_by_host_timing_races_the_consumer(daemons: Daemons, dataset: Dataset) -> None:
    """The same without the client's fence (as the client was): the
    consumer's kernels read slots the daemon has already filled again."""
    d = daemons.start(dataset.bmap)
    want = {h: [p, l] for h, (p, l) in dataset.by_hash.items()}
    r = _client(daemons, d, want, batch_size=5, gpu_path="bounce", backend="file", epochs=1, fence=False)
    assert r["bad"] != [], "no sample read wrong: the test no longer sees the race"
    daemons.stop_all()
    standin.assert_clean(daemons.report, 2)


def test_dense_batches_for_dali(daemons: Daemons, dataset: Dataset) -> None:
    """Samples of one size: the daemon packs each batch, the client yields
    one (batch, size) CudaArray with batch_format="dali"."""
    pytest.importorskip("nvidia.dali")
    root = dataset.root.parent / "same-size"
    want = {}
    for i in range(24):
        p = root / f"c{i % 2}" / f"{i:02d}.jpg"  # the extension mkbmap takes
        p.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(8192)
        p.write_bytes(data)
        want[hashlib.sha256(data).hexdigest()] = [str(p.relative_to(root)), i % 2]
    os.sync()
    bmap = daemons.tmp / "same.bmap"
    subprocess.run([str(BIN / "mkbmap"), "--mountpoint", str(root), "-o", str(bmap)], check=True, capture_output=True)
    d = daemons.start(bmap)
    r = _client(daemons, d, want, batch_size=4, batch_format="dali", epochs=1)
    assert r["bad"] == [] and r["samples"] == 24 and r["dense_batches"] == 6, r
    daemons.stop_all()
    standin.assert_clean(daemons.report, 2)
