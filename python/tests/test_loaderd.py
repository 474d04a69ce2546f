# SPDX-License-Identifier: Apache-2.0
"""LoaderSource against a real loaderd: bytes, labels, sharding, resume,
errors, reaping."""

from __future__ import annotations

import hashlib
import os
import http.client
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgpack
import pytest

from conftest import WAIT, Daemon, Dataset, need_raw, small_dataset, start_daemon, stop_daemon
from nvfeed import DaemonGoneError, LoaderError, LoaderSource

BACKENDS = ["file", "gds", "bam"]


def _epoch(src: LoaderSource, dataset: Dataset) -> list[tuple[str, int]]:
    """One epoch as (path, label), each sample identified by its bytes."""
    out = []
    for samples, labels in src:
        assert labels.dtype.name == "int32" and labels.shape == (len(samples), 1)
        for s, lbl in zip(samples, labels[:, 0]):
            assert s.dtype.name == "uint8" and s.ndim == 1
            path, want_label = dataset.by_hash[hashlib.sha256(s.tobytes()).hexdigest()]  # KeyError: bytes of no file
            assert int(lbl) == want_label, f"{path}: label {lbl}, want {want_label}"
            out.append((path, int(lbl)))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_byte_exact_two_shards_two_epochs(daemon: Daemon, dataset: Dataset, backend: str) -> None:
    need_raw(dataset, backend)
    srcs = [LoaderSource("train", socket=daemon.socket, batch_size=4, shard_id=k, num_shards=2,
                         random_shuffle=True, seed=3, backend=backend) for k in range(2)]
    try:
        orders = []
        for epoch in range(2):
            shards = [_epoch(s, dataset) for s in srcs]
            a, b = ({p for p, _ in sh} for sh in shards)
            assert not a & b, "shards overlap"
            assert a | b == {p for p, _ in dataset.files}, "shards do not cover the dataset"
            assert sum(len(sh) for sh in shards) == len(dataset.files)
            orders.append(shards[0])
        assert orders[0] != orders[1], "shuffle gave the same order twice"
        assert len(srcs[0]) in (5, 6)
    finally:
        for s in srcs:
            s.close()


def test_unshuffled_order_is_dali_order(daemon: Daemon, dataset: Dataset) -> None:
    with LoaderSource("train", socket=daemon.socket, batch_size=7) as src:
        assert _epoch(src, dataset) == dataset.files
        assert len(src) == (len(dataset.files) + 6) // 7


def test_state_resumes_exactly(daemon: Daemon, dataset: Dataset) -> None:
    kw = dict(socket=daemon.socket, batch_size=4, random_shuffle=True, seed=11)
    with LoaderSource("train", **kw) as ref:
        want = _epoch(ref, dataset) + _epoch(ref, dataset)
    with LoaderSource("train", **kw) as a:
        got = []
        for _ in range(5):
            samples, _ = next(a)
            got += [dataset.by_hash[hashlib.sha256(s.tobytes()).hexdigest()] for s in samples]
        state = a.state()
    with LoaderSource("train", state=state, **kw) as b:
        got += _epoch(b, dataset) + _epoch(b, dataset)
    assert got == want


def test_daemon_errors_become_exceptions(daemon: Daemon) -> None:
    cases = [
        (dict(dataset="nope"), "unknown dataset"),
        (dict(dataset="train", backend="tape"), "unknown backend"),
        (dict(dataset="train", num_shards=100), "num_shards 100 not in \\[1, 45\\]"),  # past the samples: the daemon knows
    ]
    for kw, msg in cases:
        name = kw.pop("dataset")
        with pytest.raises(LoaderError, match=msg):
            LoaderSource(name, socket=daemon.socket, **kw)
    # Ranges that need no dataset are the client's to check first (the
    # daemon's answers to them: test_garbage_requests_get_4xx).
    for kw, msg in [(dict(batch_size=0), "batch_size must be an int in"), (dict(shard_id=2, num_shards=2), "shard_id must be"),
                    (dict(batch_size=10**9), "batch_size must be an int in")]:
        with pytest.raises(ValueError, match=msg):
            LoaderSource("train", socket=daemon.socket, **kw)
    with pytest.raises(DaemonGoneError, match="is loaderd running at /nonexistent.sock"):
        LoaderSource("train", socket="/nonexistent.sock")


def _raw_request(sock_path: str, method: str, path: str, body: bytes) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("x")
    c.sock = socket.socket(socket.AF_UNIX)
    c.sock.connect(sock_path)
    c.request(method, path, body=body)
    r = c.getresponse()
    return r.status, r.read()


def test_garbage_requests_get_4xx(daemon: Daemon) -> None:
    with LoaderSource("train", socket=daemon.socket, batch_size=3) as ok:
        next(ok)
        for method, path, body, code in [
            ("POST", "/v1/sessions", b"\xc1\xff garbage", 400),
            ("POST", "/v1/sessions", msgpack.packb({"dataset": "train", "batch_size": "big"}), 400),
            ("POST", "/v1/sessions", msgpack.packb({"dataset": "train", "batch_size": 2, "evil": 1}), 400),
            ("POST", "/v1/sessions", msgpack.packb({"dataset": "train", "batch_size": 0, "num_shards": 1}), 400),
            ("POST", "/v1/sessions", msgpack.packb({"dataset": "train", "batch_size": 2, "num_shards": 2, "shard_id": 2}), 400),
            ("POST", "/v1/sessions", msgpack.packb({"dataset": "train", "batch_size": 2}), 400),  # num_shards 0: no default
            ("POST", "/v1/sessions", msgpack.packb({"dataset": "train", "batch_size": 2, "num_shards": 1,
                                                    "prefetch_queue_depth": 0}), 400),
            ("POST", "/v1/sessions", msgpack.packb({"dataset": "train", "batch_size": 2, "num_shards": 1,
                                                    "job_id": "j" * 129}), 400),
            ("POST", "/v1/sessions/deadbeef/next", b"", 404),
            ("POST", f"/v1/sessions/{ok._session.id}/release", msgpack.packb({"slot": 99}), 400),
            ("GET", "/v1/nothing", b"", 404),
            ("PUT", "/v1/sessions", b"", 405),
        ]:
            status, raw = _raw_request(daemon.socket, method, path, body)
            assert status == code, (method, path, status, raw)
            assert msgpack.unpackb(raw)["error"]
        next(ok)  # the good session is unaffected
    assert _raw_request(daemon.socket, "GET", "/healthz", b"")[0] == 200


def _batch_memories(pid: int) -> int:
    """The batch memories (memfds) process pid holds open."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:nvfeed-batches")
        except OSError:
            pass
    return n


def test_daemon_killed_leaves_nothing_and_batches_stay(dataset: Dataset, tmp_path: Path) -> None:
    """kill -9 of the daemon: no file of its own is left in /dev/shm (batch
    memory is a memfd passed to the client, never named), and the batch the
    client holds stays mapped and unchanged."""
    before = set(os.listdir("/dev/shm"))
    d = start_daemon(tmp_path, dataset.bmap)
    try:
        src = LoaderSource("train", socket=d.socket, batch_size=4, random_shuffle=True, seed=3, reconnect_timeout=0)
        samples, labels = next(src)
        assert _batch_memories(d.proc.pid) == 1
        assert set(os.listdir("/dev/shm")) == before, "the daemon named its batch memory in /dev/shm"
        copies = [bytes(s) for s in samples]
    finally:
        d.proc.kill()
        d.proc.wait()
    assert set(os.listdir("/dev/shm")) == before, "files left in /dev/shm after kill -9"
    assert [bytes(s) for s in samples] == copies, "a held batch changed after the daemon died"
    for s, lbl in zip(samples, labels[:, 0]):
        assert dataset.by_hash[hashlib.sha256(s.tobytes()).hexdigest()][1] == lbl
    with pytest.raises(DaemonGoneError):  # after what the daemon had already pushed
        for _ in range(20):
            try:
                next(src)
            except StopIteration:
                pass


def test_killed_client_is_reaped(daemon: Daemon, dataset: Dataset) -> None:
    child = subprocess.Popen([sys.executable, "-c", f"""
from nvfeed import LoaderSource
s = LoaderSource("train", socket={daemon.socket!r}, batch_size=2)
next(s)
print(s._session._mm and s._session.id, flush=True)
import time; time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    sid = child.stdout.readline().strip()
    assert sid
    with LoaderSource("train", socket=daemon.socket, batch_size=5) as other:
        before = _batch_memories(daemon.proc.pid)
        child.send_signal(signal.SIGKILL)
        child.wait()
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline and _batch_memories(daemon.proc.pid) >= before:
            other.state()  # keeps this session alive while the other idles
            time.sleep(0.2)
        assert _batch_memories(daemon.proc.pid) == before - 1, "the killed client's batch memory was not freed"
        status, _ = _raw_request(daemon.socket, "GET", f"/v1/sessions/{sid}/state", b"")
        assert status == 404, "killed client's session was not reaped"
        _epoch(other, dataset)  # the other session goes on


def test_metrics(daemon: Daemon) -> None:
    with LoaderSource("train", socket=daemon.socket, batch_size=4) as s:
        next(s)
        status, raw = _raw_request(daemon.socket, "GET", "/metrics", b"")
    text = raw.decode()
    assert status == 200
    for name in ("nvfeed_samples_total", "nvfeed_bytes_total", "nvfeed_batches_total", "nvfeed_batch_read_seconds_bucket", "nvfeed_sessions"):
        assert name in text, name


def test_client_is_the_installed_package() -> None:
    """scripts/venv.sh installs the client: the package nvfeed (typed) and
    the module dali_source.py, DALI's external_source shim."""
    import dali_source
    import nvfeed
    for m in (nvfeed, dali_source):
        assert "site-packages" in m.__file__, f"imported {m.__file__}, not the installed package"
    assert os.path.exists(os.path.join(os.path.dirname(nvfeed.__file__), "py.typed")), "nvfeed: py.typed not installed"
    assert os.path.basename(dali_source.__file__) == "dali_source.py", dali_source.__file__


def test_backends_described(daemon: Daemon) -> None:
    from nvfeed import backends
    d = backends(daemon.socket)
    assert d["default"] == "file" and d["auto"] == "gds" and d["prefetch_queue_depth"] == 2
    by_name = {b["name"]: b for b in d["backends"]}
    assert set(by_name) == {"file", "gds", "bam", "cufile"}
    assert by_name["cufile"]["device_writes"] and not by_name["gds"]["device_writes"]
    qd = {o["name"]: o for o in by_name["gds"]["options"]}["queue_depth"]
    assert qd["kind"] == "int" and qd["default"] == 32 and qd["min"] == 1
    with pytest.raises(LoaderError, match='backend file has no option "queue_depth"'):
        LoaderSource("train", socket=daemon.socket, batch_size=2, backend_options={"queue_depth": 4})
    with pytest.raises(LoaderError, match="queue_depth: 0 not in"):
        LoaderSource("train", socket=daemon.socket, batch_size=2, backend="gds", backend_options={"queue_depth": 0})


def test_state_has_explicit_keys(daemon: Daemon) -> None:
    with LoaderSource("train", socket=daemon.socket, batch_size=4, seed=5, random_shuffle=True) as src:
        next(src)
        st = src.state()
    assert st["version"] == 4 and st["epoch"] == 0 and st["batch"] == 1  # the computed permutation's
    assert set(st["sampling"]) == {"n", "batch_size", "shard_id", "num_shards", "random_shuffle", "seed", "pad_last_batch", "stick_to_shard",
                                   "shuffle", "initial_fill", "shuffle_after_epoch"}
    assert st["sampling"]["shuffle"] == "permute" and st["sampling"]["initial_fill"] == 1024
    bad = dict(st, sampling=dict(st["sampling"], seed=6))
    with pytest.raises(LoaderError, match=r"seed 6 \(now 5\)"):
        LoaderSource("train", socket=daemon.socket, batch_size=4, seed=5, random_shuffle=True, state=bad)


def test_gpu_without_driver_says_so(daemon: Daemon) -> None:
    if os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("an NVIDIA driver is present: the no-driver error cannot be tested here")
    from nvfeed import CudaError  # this process's own driver, looked for before the daemon is asked
    with pytest.raises(CudaError, match="no NVIDIA driver found"):
        LoaderSource("train", socket=daemon.socket, batch_size=2, device="gpu")


def test_engines_per_device(dataset: Dataset, tmp_path: Path) -> None:
    """A daemon whose sessions share one engine per device: three sessions
    read at once (threads), each byte- and label-exact, the shards covering
    the dataset; one closed mid-way leaves the engine to the others."""
    need_raw(dataset, "gds")
    d = start_daemon(tmp_path, dataset.bmap, "--engines", "device")
    try:
        srcs = [LoaderSource("train", socket=d.socket, batch_size=3, shard_id=k, num_shards=3,
                             random_shuffle=True, seed=5, backend="gds") for k in range(3)]
        first = srcs.pop(0)
        got = [_epoch(first, dataset)]
        first.close()  # the session whose open started the engine
        with ThreadPoolExecutor(len(srcs)) as pool:
            got += list(pool.map(lambda s: _epoch(s, dataset), srcs))
        for s in srcs:
            s.close()
        paths = [p for shard in got for p, _ in shard]
        assert sorted(paths) == sorted(p for p, _ in dataset.files)
        assert "shared by the sessions on this device" in d.log.read_text()
    finally:
        assert stop_daemon(d) == 0, d.log.read_text()


def test_default_backend_is_the_fastest_the_dataset_allows(daemon: Daemon, dataset: Dataset, tmp_path: Path) -> None:
    """A source that names no backend reads raw (gds) over a block device's
    map and says why, in its attribute and in `loaderd status`; a named
    backend is kept and says nothing; a dataset on a filesystem without a
    block device (tmpfs) gets file, saying why."""
    need_raw(dataset, "gds")
    with LoaderSource("train", socket=daemon.socket, batch_size=4) as auto, \
            LoaderSource("train", socket=daemon.socket, batch_size=4, backend="file") as named:
        assert auto.backend == "gds" and "raw reads from /dev/" in auto.backend_why, (auto.backend, auto.backend_why)
        assert named.backend == "file" and named.backend_why == ""
        assert sorted(_epoch(auto, dataset)) == sorted(_epoch(named, dataset))
        out = subprocess.run([str(Path(__file__).parents[2] / "bin" / "loaderd"), "status", "--socket", daemon.socket],
                             capture_output=True, text=True, check=True).stdout
        assert auto.backend_why in out, out
    shm = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        root, bmap, _ = small_dataset(shm, "t")
        d = start_daemon(tmp_path, bmap)
        try:
            with LoaderSource("train", socket=d.socket, batch_size=2) as src:
                assert src.backend == "file" and "no block device" in src.backend_why, (src.backend, src.backend_why)
        finally:
            stop_daemon(d)
    finally:
        shutil.rmtree(shm)
