# SPDX-License-Identifier: Apache-2.0
"""The client's GPU side against the C CUDA stand-in (no GPU): a daemon
process exports device memory, the client process finds its GPU by UUID
under another CUDA_VISIBLE_DEVICES and maps it through the client's own
library discovery; the release fence against a consumer's slow kernel;
LoaderSource with reconnect and arrays held at exit. Every process's
report: no violation, nothing left allocated, mapped or retained.

The same with a real loaderd: test_standin_daemon.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import standin

TESTS = Path(__file__).resolve().parent
ROLES = str(TESTS / "standin_roles.py")


@pytest.fixture(scope="session")
def standin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return standin.build(tmp_path_factory.mktemp("cuda-standin"))


def _last_json(out: str) -> dict[str, Any]:
    lines = [l for l in out.splitlines() if l.startswith("{")]
    assert lines, out
    r: dict[str, Any] = json.loads(lines[-1])
    return r


def _pair(standin_dir: Path, report: Path, mode: str) -> dict[str, Any]:
    """The exporter (CUDA_VISIBLE_DEVICES=0,1: memory on its GPU 1) and the
    importer (1,0: the same GPU is its 0), over a socket pair."""
    a, b = socket.socketpair()
    with a, b:
        exp = subprocess.Popen([sys.executable, ROLES, "exporter", str(a.fileno())], pass_fds=[a.fileno()],
                               env=standin.env(standin_dir, report, "0,1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        imp = subprocess.Popen([sys.executable, ROLES, "importer", str(b.fileno()), mode], pass_fds=[b.fileno()],
                               env=standin.env(standin_dir, report, "1,0"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    iout, ierr = imp.communicate(timeout=120)
    eout, eerr = exp.communicate(timeout=120)
    assert exp.returncode == 0 and imp.returncode == 0, (eout, eerr, iout, ierr)
    assert "VIOLATION" not in ierr + eerr, ierr + eerr
    assert _last_json(eout) == {"exporter": "ok"}
    return _last_json(iout)


@pytest.mark.parametrize("mode", ["ctx", "stream"])
def test_import_by_uuid_and_release_after_the_consumer(standin_dir: Path, tmp_path: Path, mode: str) -> None:
    """The client maps the daemon's memory on its own ordinal of the GPU
    (0, where the daemon's is 1) and reads the daemon's bytes; a slow
    kernel still reading the memory when the slot is released reads the
    old bytes: the fence (device-wide, or on the kernel's stream) waited
    for it before the daemon wrote again. The mapping goes when its last
    array does; both processes end clean."""
    r = _pair(standin_dir, tmp_path, mode)
    assert r["device"] == 0
    assert r["first"] == "A" * 16
    assert r["kernel_read"] == ["A"], "the released slot was overwritten before the consumer's kernel ran"
    assert r["mapped_after_retire"] and not r["mapped_after_last_array"]
    standin.assert_clean(tmp_path, 2)


def test_release_by_host_timing_races_the_consumer(standin_dir: Path, tmp_path: Path) -> None:
    """Without the fence (the client before it), the kernel reads the bytes
    the daemon wrote after the release: the race the fence closes is real
    in the stand-in."""
    r = _pair(standin_dir, tmp_path, "none")
    assert r["kernel_read"] == ["B"]
    standin.assert_clean(tmp_path, 2)


def test_arrays_held_at_exit(standin_dir: Path, tmp_path: Path) -> None:
    """A client that ends holding an array of a retired mapping: unmapped
    at exit, once, with a context (no violation), nothing left."""
    r = _pair(standin_dir, tmp_path, "exit-ctx")
    assert r["mapped_after_retire"] and "mapped_after_last_array" not in r
    standin.assert_clean(tmp_path, 2)


def _source(standin_dir: Path, report: Path, mode: str) -> dict[str, Any]:
    p = subprocess.run([sys.executable, ROLES, "source", mode], env=standin.env(standin_dir, report, "0,1"),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "VIOLATION" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr
    return _last_json(p.stdout)


@pytest.mark.parametrize("mode", ["race-ctx", "race-stream"])
def test_source_release_waits_for_the_consumer(standin_dir: Path, tmp_path: Path, mode: str) -> None:
    """LoaderSource(release_after=0): a slow kernel reads every sample of a
    batch; the next fetch releases the batch and the daemon double
    overwrites its slot at once. Every kernel read its sample's own
    bytes."""
    r = _source(standin_dir, tmp_path, mode)
    assert r["reads"] == 12 and r["reads_right"] == 12
    standin.assert_clean(tmp_path, 1)


def test_source_release_by_host_timing_races(standin_dir: Path, tmp_path: Path) -> None:
    """The same without the fence: kernels read the daemon's new bytes."""
    r = _source(standin_dir, tmp_path, "race-none")
    assert r["reads"] == 12 and r["reads_right"] < 12
    standin.assert_clean(tmp_path, 1)


def test_source_reconnect_and_exit(standin_dir: Path, tmp_path: Path) -> None:
    """batch_format="dali" on GPU memory: each batch one dense (3, 4096)
    CudaArray with the files' bytes; a reconnect maps a second session's
    memory; arrays of both held at exit: nothing leaks."""
    r = _source(standin_dir, tmp_path, "reconnect")
    assert r == {"sessions": 2, "dense": True, "bytes_right": True}
    standin.assert_clean(tmp_path, 1)
