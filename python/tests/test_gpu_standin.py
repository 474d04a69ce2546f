# SPDX-License-Identifier: Apache-2.0
"""The whole GPU path, daemon and client in separate processes, run
against the strict CUDA stand-in (internal/cuda/standin: libcuda.so.1,
libcudart.so.13 and libcufile.so.0 over host memory, found through the
same discovery as NVIDIA's libraries: NVFEED_CUDA_LIB_DIR). Every sample
is copied back from its device address and compared with its file; each
process's stand-in report must show no violated precondition and nothing
left allocated, mapped or registered. The daemon and the clients see the
two stand-in GPUs in opposite orders (CUDA_VISIBLE_DEVICES), so a GPU named
by ordinal instead of UUID shows up as the wrong GPU.

Nothing here runs on a GPU: bench/gpu.sh is the same check for a machine
with one."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import standin as standin_lib
from conftest import REPO, Daemon, Dataset, faults_build, need_raw, start_daemon, stop_daemon

CLIENT = Path(__file__).with_name("gpu_client.py")
GPUS = 2
# What the stand-in counts that is no leak: contexts the runtime binds to
# threads (held until exit, as the real runtime does) and the cuFile
# driver (open for the process's life, as KvikIO keeps it).
NOT_LEAKS = {"runtime_contexts", "cufile_driver_open"}


def standin_uuid(i: int) -> str:
    """The stand-in's UUID of physical GPU i, as nvidia-smi prints UUIDs."""
    h = (b"STANDIN-GPU-000" + str(i).encode()).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass
class StandIn:
    lib: Path
    reports: Path

    def env(self, visible: str, **extra: str) -> dict[str, str]:
        return {"NVFEED_CUDA_LIB_DIR": str(self.lib), "CUDA_STANDIN_REPORT": str(self.reports),
                "CUDA_STANDIN_GPUS": str(GPUS), "CUDA_VISIBLE_DEVICES": visible,
                **standin_lib.cufile_host(self.reports.parent / "cufile-host"), **extra}

    def report(self, pid: int) -> dict[str, Any]:
        p = self.reports / f"{pid}.json"
        assert p.exists(), f"no stand-in report for process {pid}: the stand-in was not loaded (reports: " \
                           f"{sorted(x.name for x in self.reports.iterdir())})"
        r: dict[str, Any] = json.loads(p.read_text())
        return r

    def assert_clean(self, pid: int, what: str) -> dict[str, Any]:
        r = self.report(pid)
        assert r["violations"] == [], f"{what}: CUDA preconditions violated: {r['violations']}"
        live = {k: v for k, v in r["live"].items() if v and k not in NOT_LEAKS}
        assert not live, f"{what}: left allocated, mapped or registered at exit: {live}"
        assert r["spinning_events"] == 0, f"{what}: events that spin a core while waited on"
        return r


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> StandIn:
    lib = standin_lib.build(tmp_path_factory.mktemp("standin-lib"))
    return StandIn(lib, tmp_path_factory.mktemp("standin-reports"))


def _uniform(parent: Path, name: str, n: int = 24, size: int = 6000) -> tuple[Path, Path, dict[str, int]]:
    """Two classes of samples of one size (not a multiple of 4 KiB): every
    batch is dense on GPU memory. Returns the root, its map, sha256 -> label."""
    import hashlib
    root = parent / name
    rng = np.random.default_rng(5)
    by_hash = {}
    for i in range(n):
        p = root / f"c{i % 2}" / f"{i:02d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        data = rng.integers(0, 255, size, dtype=np.uint8).tobytes()
        p.write_bytes(data)
        by_hash[hashlib.sha256(data).hexdigest()] = i % 2
    os.sync()
    bmap = parent / f"{name}.bmap"
    subprocess.run([str(REPO / "bin" / "mkbmap"), "--mountpoint", str(root), "-o", str(bmap)], check=True,
                   capture_output=True)
    return root, bmap, by_hash


@pytest.fixture(scope="module")
def gpu_daemon(dataset: Dataset, standin: StandIn, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("gpud"), dataset.bmap, "--session-timeout", "5s",
                     env=standin.env("1,0"))
    yield d
    assert stop_daemon(d) == 0, d.log.read_text()
    standin.assert_clean(d.proc.pid, "loaderd")


def _popen_client(standin: StandIn, visible: str = "0,1", **kw: Any) -> subprocess.Popen[str]:
    env = {**os.environ, **standin.env(visible), "PYTHONPATH": str(REPO / "python")}
    return subprocess.Popen([sys.executable, str(CLIENT), json.dumps(kw)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.PIPE, text=True, env=env)


def client(standin: StandIn, visible: str = "0,1", timeout: float = 120, **kw: Any) -> tuple[list[dict[str, Any]], int]:
    """gpu_client.py run to its end: its JSON lines and its pid."""
    p = _popen_client(standin, visible, **kw)
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, f"client failed ({p.returncode}): {err[-3000:]}"
    lines = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert lines and lines[-1].get("done"), out[-2000:]
    return lines, p.pid


def _hashes(dataset: Dataset) -> dict[str, int]:
    return {h: lbl for h, (_, lbl) in dataset.by_hash.items()}


def _check_samples(lines: list[dict[str, Any]], by_hash: dict[str, int]) -> dict[int, list[str]]:
    """Every sample's bytes equal a file's and its label that file's;
    returns the hashes per epoch."""
    per_epoch: dict[int, list[str]] = collections.defaultdict(list)
    for x in lines:
        if "hash" not in x:
            continue
        assert x["hash"] in by_hash, f"epoch {x['epoch']}: a sample's device bytes equal no file ({x})"
        assert x["label"] == by_hash[x["hash"]], f"epoch {x['epoch']}: wrong label {x}"
        per_epoch[x["epoch"]].append(x["hash"])
    return per_epoch


PATHS = [("bounce", "file"), ("bounce", "gds"), ("bounce", "bam"), ("cufile", "cufile")]


@pytest.mark.parametrize("gpu_path,backend", PATHS, ids=[f"{p}-{b}" for p, b in PATHS])
def test_exact_two_epochs_two_shards_shuffled(dataset: Dataset, standin: StandIn, gpu_daemon: Daemon,
                                              gpu_path: str, backend: str) -> None:
    need_raw(dataset, backend if backend != "cufile" else "file")
    by_hash = _hashes(dataset)
    union: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for shard in range(2):
        lines, pid = client(standin, socket=gpu_daemon.socket, batch_size=4, shard_id=shard, num_shards=2,
                            random_shuffle=True, seed=3, backend=backend, gpu_path=gpu_path, device_id=0, epochs=2)
        assert lines[0]["gpu_path"] == gpu_path
        mem = lines[1]["memory"]
        # The client's GPU 0 is physical GPU 0; the daemon calls it 1.
        assert mem["uuid"] == standin_uuid(0) and mem["device"] == 1, mem
        for e, hs in _check_samples(lines, by_hash).items():
            union[e].update(hs)
        standin.assert_clean(pid, f"client shard {shard}")
    assert set(union) == {0, 1}
    for e, c in union.items():
        assert c == collections.Counter(by_hash.keys()), f"epoch {e}: the two shards do not cover the dataset exactly once"


@pytest.mark.parametrize("gpu_path,backend", [("bounce", "file"), ("bounce", "gds"), ("cufile", "cufile")])
def test_dense_batches_are_one_array(dataset: Dataset, standin: StandIn, tmp_path: Path, gpu_path: str,
                                     backend: str) -> None:
    need_raw(dataset, backend if backend != "cufile" else "file")
    _, bmap, by_hash = _uniform(dataset.root.parent, f"uniform-{gpu_path}-{backend}")
    d = start_daemon(tmp_path, bmap, env=standin.env("1,0"))
    try:
        lines, pid = client(standin, socket=d.socket, batch_size=5, random_shuffle=True, seed=1, backend=backend,
                            gpu_path=gpu_path, batch_format="dali", epochs=2, use_labels_source=True)
    finally:
        assert stop_daemon(d) == 0
    samples = [x for x in lines if "hash" in x]
    assert samples and all(x["dense"] for x in samples), "a batch of equal-sized samples was not one dense array"
    per_epoch = _check_samples(lines, by_hash)
    for e, hs in per_epoch.items():
        assert collections.Counter(hs) == collections.Counter(by_hash.keys()), f"epoch {e}"
    standin.assert_clean(pid, "client")
    standin.assert_clean(d.proc.pid, "loaderd")


@pytest.mark.parametrize("mode,want", [("compat", "bounce"), ("gds", "cufile")])
def test_auto_chooses_by_cufile_mode(dataset: Dataset, standin: StandIn, tmp_path: Path, mode: str, want: str) -> None:
    d = start_daemon(tmp_path, dataset.bmap, env=standin.env("1,0", CUFILE_STANDIN_MODE=mode))
    try:
        lines, pid = client(standin, socket=d.socket, batch_size=8, gpu_path="auto", epochs=1)
        assert lines[0]["gpu_path"] == want, f"cuFile in {mode} mode: auto chose {lines[0]['gpu_path']}"
        _check_samples(lines, _hashes(dataset))
    finally:
        assert stop_daemon(d) == 0
    log = d.log.read_text()
    assert (mode == "compat") == ("compatibility mode" in log), log[-3000:]
    standin.assert_clean(d.proc.pid, "loaderd")


@pytest.mark.parametrize("backend", ["file", "gds"])
def test_skip_failed_sample_good_bytes_published(dataset: Dataset, standin: StandIn, tmp_path: Path,
                                                 backend: str) -> None:
    """on_error="skip" on the bounce path: the batch with a failed sample
    is still copied to the device, so its good samples are their files'
    bytes, not the slot's previous contents."""
    need_raw(dataset, backend)
    victim = dataset.files[9][0]
    d = start_daemon(tmp_path, dataset.bmap, "--inject-eio", victim, binary=faults_build(),
                     env=standin.env("1,0"))
    try:
        lines, pid = client(standin, socket=d.socket, batch_size=4, backend=backend, gpu_path="bounce",
                            on_error="skip", epochs=2)
    finally:
        assert stop_daemon(d) == 0
    per_epoch = _check_samples(lines, _hashes(dataset))
    assert lines[-1]["skipped"] == 2, lines[-1]
    for e, hs in per_epoch.items():
        assert len(hs) == len(dataset.files) - 1, f"epoch {e}: {len(hs)} samples"
    standin.assert_clean(pid, "client")


@pytest.mark.parametrize("stream", [False, True], ids=["context-sync", "cuda_stream"])
def test_release_waits_for_the_consumers_gpu_work(dataset: Dataset, standin: StandIn, gpu_daemon: Daemon,
                                                  stream: bool) -> None:
    """A consumer's kernel, queued on its stream, reads the first batch
    300 ms late; with release_after 0 and a prefetch of 1 the slot goes back
    at once. The client must make that work finish before it releases the
    slot, or the daemon's next batch overwrites the bytes under it."""
    lines, pid = client(standin, socket=gpu_daemon.socket, batch_size=4, prefetch_queue_depth=1, release_after=0,
                        gpu_path="bounce", backend="file", epochs=1, consumer_delay_us=300_000, pass_stream=stream)
    res = [x for x in lines if "consumer_saw_its_batch" in x]
    assert res and res[0]["consumer_saw_its_batch"], "the slot was overwritten under the consumer's queued work"
    standin.assert_clean(pid, "client")


def test_reconnect_across_daemon_restart(dataset: Dataset, standin: StandIn, tmp_path: Path) -> None:
    """A GPU source outlives a daemon restart: the same samples as an
    uninterrupted run, and the old device mapping is unmapped once its
    arrays are gone (the client's report: nothing left mapped)."""
    kw = dict(batch_size=4, random_shuffle=True, seed=9, gpu_path="bounce", backend="file", epochs=2)
    d = start_daemon(tmp_path, dataset.bmap, env=standin.env("1,0"))
    try:
        ref, _ = client(standin, socket=d.socket, **kw)
        p = _popen_client(standin, socket=d.socket, reconnect_timeout=30, pause_after=3, **kw)
        assert p.stdout is not None and p.stdin is not None
        lines = []
        while True:
            line = p.stdout.readline()
            assert line, f"the client ended before pausing: {p.stderr.read() if p.stderr else ''}"
            x = json.loads(line)
            if x.get("paused"):
                break
            lines.append(x)
        d.proc.kill()
        d.proc.wait(timeout=10)
        d = start_daemon(tmp_path, dataset.bmap, env=standin.env("1,0"))
        out, err = p.communicate("go\n", timeout=120)
        assert p.returncode == 0, err[-3000:]
        lines += [json.loads(x) for x in out.splitlines() if x.strip()]
        assert "reconnecting" in err, err[-2000:]
    finally:
        assert stop_daemon(d) == 0
    key = [(x["epoch"], x["hash"], x["label"]) for x in lines if "hash" in x]
    assert key == [(x["epoch"], x["hash"], x["label"]) for x in ref if "hash" in x]
    standin.assert_clean(p.pid, "client after a reconnect")


def test_process_exit_holding_arrays_leaks_nothing(dataset: Dataset, standin: StandIn, gpu_daemon: Daemon) -> None:
    lines, pid = client(standin, socket=gpu_daemon.socket, batch_size=8, gpu_path="bounce", backend="file", epochs=1,
                        end="hold")
    assert lines[-1]["held"] > 0
    standin.assert_clean(pid, "a client that exited holding its arrays and its source")


def _get(sock: str, path: str) -> int:
    import http.client
    import socket as so

    class Conn(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = so.socket(so.AF_UNIX, so.SOCK_STREAM)
            self.sock.settimeout(10)
            self.sock.connect(sock)

    c = Conn("localhost")
    try:
        c.request("GET", urllib.parse.quote(path))
        r = c.getresponse()
        r.read()
        return r.status
    finally:
        c.close()


def test_metrics_scrape_during_cufile_close(dataset: Dataset, standin: StandIn, tmp_path: Path) -> None:
    """/metrics scraped without pause while cufile sessions open, read and
    close: the daemon lives through every close."""
    d = start_daemon(tmp_path, dataset.bmap, env=standin.env("1,0"))
    stop = threading.Event()
    scrapes, bad = [0], []

    def scrape() -> None:
        while not stop.is_set():
            try:
                s = _get(d.socket, "/metrics")
                scrapes[0] += 1
                if s != 200:
                    bad.append(s)
            except OSError as e:
                bad.append(str(e))
                time.sleep(0.01)

    t = threading.Thread(target=scrape)
    t.start()
    try:
        for _ in range(4):
            lines, pid = client(standin, socket=d.socket, batch_size=16, gpu_path="cufile", epochs=1)
            standin.assert_clean(pid, "client")
            assert d.proc.poll() is None, f"loaderd died: {d.log.read_text()[-3000:]}"
    finally:
        stop.set()
        t.join()
        code = stop_daemon(d)
    assert code == 0, d.log.read_text()[-3000:]
    assert scrapes[0] > 10 and not bad, (scrapes, bad[:5])
    standin.assert_clean(d.proc.pid, "loaderd")


def _npy_dataset(parent: Path, name: str, arrays: dict[str, np.ndarray]) -> tuple[Path, collections.Counter]:
    """np.save's files of a numpy dataset beside the shared one (same
    filesystem), its map (mkbmap --reader numpy), and what an epoch must
    hold: (sha256 of the array's bytes, shape, typestr) per file."""
    import hashlib
    root = parent / name
    want: collections.Counter = collections.Counter()
    for f, a in arrays.items():
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        np.save(root / f, a)
        back = np.load(root / f)
        want[(hashlib.sha256(back.tobytes()).hexdigest(), tuple(back.shape), back.dtype.str)] += 1
    os.sync()
    bmap = parent / f"{name}.bmap"
    subprocess.run([str(REPO / "bin" / "mkbmap"), "--reader", "numpy", "--mountpoint", str(root), "-o", str(bmap)],
                   check=True, capture_output=True)
    return bmap, want


def _npy_sets() -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(21)
    return {
        # One shape, 420 bytes (no multiple of 4 KiB; each file's data at
        # byte 128): dense batches.
        "dense": {f"{i:02d}.npy": rng.standard_normal((3, 5, 7)).astype(np.float32) for i in range(10)},
        # Six 2-d shapes (one rank, as fn.readers.numpy needs), an empty
        # one among them: ragged batches of 3 (a batch of one sample would
        # be dense).
        "ragged": {"a.npy": rng.integers(-99, 99, (1, 3), dtype=np.int16),
                   "b.npy": np.array([[-5]], dtype=np.int16),
                   "c.npy": np.zeros((0, 2), dtype=np.int16),
                   "d.npy": rng.integers(-99, 99, (2, 2), dtype=np.int16),
                   "e.npy": rng.integers(-99, 99, (1, 3000), dtype=np.int16),  # more than a block
                   "g/h.npy": rng.integers(-99, 99, (2, 1), dtype=np.int16)},
    }


@pytest.mark.parametrize("gpu_path,backend", [("bounce", "file"), ("bounce", "gds"), ("cufile", "cufile")])
@pytest.mark.parametrize("kind", ["dense", "ragged"])
def test_numpy_tensors_exact_in_device_memory(dataset: Dataset, standin: StandIn, tmp_path: Path, gpu_path: str,
                                              backend: str, kind: str) -> None:
    """A numpy dataset served into GPU memory: the stand-in's device
    memory holds each array's exact bytes (np.load's) at the address,
    shape, dtype and C-order strides its CudaArray advertises; a batch of
    one shape is one dense (batch, *shape) array, shuffled or not, two
    epochs each holding every array once."""
    need_raw(dataset, backend if backend != "cufile" else "file")
    bmap, want = _npy_dataset(dataset.root.parent, f"npy-{kind}-{gpu_path}-{backend}", _npy_sets()[kind])
    d = start_daemon(tmp_path, bmap, env=standin.env("1,0"))
    try:
        lines, pid = client(standin, socket=d.socket, batch_size=4 if kind == "dense" else 3, random_shuffle=True,
                            seed=2, backend=backend, gpu_path=gpu_path, epochs=2)
    finally:
        assert stop_daemon(d) == 0, d.log.read_text()[-3000:]
    assert lines[0]["gpu_path"] == gpu_path
    arrays = [x for x in lines if "hash" in x]
    assert arrays and all(x["dense"] == (kind == "dense") for x in arrays), \
        f"{kind} batches came as {'dense arrays' if kind != 'dense' else 'lists'}"
    for e in (0, 1):
        got = collections.Counter((x["hash"], tuple(x["shape"]), x["typestr"]) for x in arrays if x["epoch"] == e)
        assert got == want, f"epoch {e}: device memory differs from the files: {got - want} not among them"
    standin.assert_clean(pid, "client")
    standin.assert_clean(d.proc.pid, "loaderd")
