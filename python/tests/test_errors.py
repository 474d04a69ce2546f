# SPDX-License-Identifier: Apache-2.0
"""Failed samples reach Python loudly, never as zero-length stand-ins; the
daemon going away is a clear error, and a saved state resumes exactly."""

from __future__ import annotations

import hashlib
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import Daemon, Dataset, faults_build, need_raw, small_dataset, start_daemon, stop_daemon
from nvfeed import DaemonGoneError, LoaderError, LoaderSource, SampleError

BACKENDS = ["file", "gds", "bam"]


def _drain(src: LoaderSource) -> list[str]:
    """One epoch, as the sha256 of each sample (taken at once: a batch's
    memory is reused once it is released)."""
    out = []
    for samples, labels in src:
        assert len(samples) == labels.shape[0]
        assert all(len(s) > 0 for s in samples), "a zero-length sample was delivered"
        out += [hashlib.sha256(s.tobytes()).hexdigest() for s in samples]
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_deleted_sample_raises_or_is_skipped(dataset: Dataset, tmp_path: Path, backend: str) -> None:
    need_raw(dataset, backend)
    root, bmap, by_hash = small_dataset(dataset.root.parent, f"del-{backend}")
    d = start_daemon(tmp_path, bmap)
    try:
        victim = "c1/29.jpg"  # the last batch: not yet prefetched when it is deleted
        with LoaderSource("train", socket=d.socket, batch_size=3, backend=backend) as src:
            (root / victim).unlink()
            got, raised = [], []
            while True:
                try:
                    samples, _ = next(src)
                except StopIteration:
                    break
                except SampleError as e:
                    raised.append(e)
                    continue
                got += samples
            assert len(raised) == 1 and victim in str(raised[0]) and len(raised[0].errors) == 1, raised
            assert all(len(s) > 0 for s in got), "a zero-length sample was delivered"
            assert len(got) == 30 - 3, "the failed batch's other samples are not delivered with raise"
            next(src)  # the session is still usable: the next epoch starts
        with LoaderSource("train", socket=d.socket, batch_size=3, backend=backend, on_error="skip") as src:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                got = _drain(src)
            assert src.skipped_samples == 1
            assert len(w) == 1 and victim in str(w[0].message)
            assert sorted(by_hash[h] for h in got) == sorted(p for p in by_hash.values() if p != victim)
    finally:
        assert stop_daemon(d) == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_injected_eio_names_the_sample(dataset: Dataset, tmp_path: Path, backend: str) -> None:
    need_raw(dataset, backend)
    victim = dataset.files[7][0]
    d = start_daemon(tmp_path, dataset.bmap, "--inject-eio", victim, binary=faults_build())
    try:
        engines = ["uring", "pread"] if backend != "file" else [None]
        for engine in engines:
            opts = {"engine": engine} if engine else None
            with LoaderSource("train", socket=d.socket, batch_size=4, backend=backend, backend_options=opts) as src:
                with pytest.raises(SampleError, match=victim) as ei:
                    _drain(src)
                assert "input/output error" in str(ei.value)
        # The daemon keeps serving: another session gets every other sample.
        with LoaderSource("train", socket=d.socket, batch_size=5, on_error="skip") as other:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert len(_drain(other)) == len(dataset.files) - 1
        assert "panic" not in d.log.read_text()
    finally:
        assert stop_daemon(d) == 0


def test_daemon_stopped_mid_epoch_then_resume(dataset: Dataset, tmp_path: Path) -> None:
    kw = dict(batch_size=4, random_shuffle=True, seed=21)
    (tmp_path / "a").mkdir()
    d = start_daemon(tmp_path / "a", dataset.bmap)
    try:
        with LoaderSource("train", socket=d.socket, **kw) as ref:
            want = _drain(ref) + _drain(ref)
        src = LoaderSource("train", socket=d.socket, timeout=5, reconnect_timeout=1, **kw)
        got = []
        for _ in range(3):
            got += [hashlib.sha256(s.tobytes()).hexdigest() for s in next(src)[0]]
        state = src.state()
    finally:
        assert stop_daemon(d) == 0
    # Batches already streamed may come first; then, after a second of trying
    # to reconnect, a clear error saying since when the daemon is gone.
    with pytest.raises(DaemonGoneError, match=r"gone since \d\d:\d\d:\d\d"), pytest.warns(RuntimeWarning, match="reconnecting"):
        for _ in range(64):
            next(src)
    src.close()  # closing a source whose daemon is gone does not hang or raise
    (tmp_path / "b").mkdir()
    d2 = start_daemon(tmp_path / "b", dataset.bmap)
    try:
        with LoaderSource("train", socket=d2.socket, state=state, **kw) as again:
            got += _drain(again) + _drain(again)
        assert got == want
    finally:
        assert stop_daemon(d2) == 0


@pytest.mark.parametrize("kwargs, message", [
    ({"on_error": "ignore"}, "on_error must be 'raise' or 'skip', got 'ignore'"),
    ({"transport": "udp"}, "transport must be 'stream' or 'http', got 'udp'"),
    ({"device": "tpu"}, "device must be 'cpu' or 'gpu', got 'tpu'"),
    ({"gpu_path": "dma"}, "gpu_path must be 'auto', 'cufile' or 'bounce', got 'dma'"),
    ({"batch_format": "torch"}, "batch_format must be 'numpy' or 'dali', got 'torch'"),
    ({"cuda_stream": 5}, "cuda_stream is for device='gpu'"),
    ({"release_after": -1}, "release_after must be an int in [0, 64] or None (derived from the DALI pipeline), got -1"),
])
def test_bad_arguments_named_before_connecting(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    """A bad argument is a ValueError naming it, raised before any daemon
    is asked (the socket here does not exist)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        LoaderSource("train", socket=str(tmp_path / "none.sock"), **kwargs)
