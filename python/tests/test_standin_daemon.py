# SPDX-License-Identifier: Apache-2.0
"""The client of a real loaderd against the CUDA stand-in, daemon and
client in separate processes with different CUDA_VISIBLE_DEVICES (0,1 and
1,0): every sample's bytes, read back from the device by a slow consumer
"kernel" on the client's stream while the source releases each batch at
once (release_after=0, so the daemon reuses a slot as soon as the client
lets it), equal the file with that label, for file, gds and bam through
bounce and for cufile, two shards, two epochs, shuffled; the GPU named by
UUID; without the client's fence the same run reads wrong bytes (the race
is real); every process's report clean. The rest of the
GPU flow (coverage of shards and epochs, dense batches, auto's choice,
skipped samples, restarts, exits, scrapes during close) is in
test_gpu_standin.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

import standin
from conftest import Daemon, Dataset, start_daemon, stop_daemon

TESTS = Path(__file__).resolve().parent
ROLES = str(TESTS / "standin_roles.py")


@pytest.fixture(scope="module")
def standin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return standin.build(tmp_path_factory.mktemp("cuda-standin"))


class Daemons:
    """Starts loaderd on the stand-in (GPUs seen as 0,1), reports in
    tmp/report; stops what it started."""

    def __init__(self, standin_dir: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.standin_dir, self.tmp, self.mp = standin_dir, tmp, monkeypatch
        self.report = tmp / "report"
        self.started: list[Daemon] = []

    def start(self, bmap: Path) -> Daemon:
        with self.mp.context() as mp:
            for k, v in standin.env(self.standin_dir, self.report, "0,1").items():
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
                       env=standin.env(ds.standin_dir, ds.report, "1,0"), capture_output=True, text=True, timeout=300)
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
