# SPDX-License-Identifier: Apache-2.0
"""A LoaderSource outlives a daemon that stops and comes back on the same
socket: it reconnects, reopens its session at its own position and yields
exactly what an uninterrupted source would have; batches it already
handed out stay valid and unchanged."""

from __future__ import annotations

import hashlib
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from conftest import Dataset, start_daemon, stop_daemon
from nvfeed import LoaderSource, NotFoundError

KW: dict[str, Any] = dict(batch_size=4, random_shuffle=True, seed=11, num_shards=2)


@dataclass
class Info:
    """What DALI's BatchInfo gives batch()."""
    epoch_idx: int
    iteration: int


def _key(samples: list[Any], labels: np.ndarray) -> tuple[tuple[str, ...], tuple[int, ...]]:
    return tuple(hashlib.sha256(s.tobytes()).hexdigest() for s in samples), tuple(int(x) for x in labels[:, 0])


def _batches(src: LoaderSource, form: str, epochs: int) -> Iterator[tuple[list[Any], np.ndarray]]:
    """Two epochs, through __iter__ or through batch(info) as DALI calls it."""
    for e in range(epochs):
        if form == "iter":
            yield from src
            continue
        i = 0
        while True:
            try:
                yield src.batch(Info(e, i))
            except StopIteration:
                break
            i += 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("form", ["iter", "batch_info"])
def test_survives_restart(dataset: Dataset, tmp_path: Path, sig: signal.Signals, form: str) -> None:
    d = start_daemon(tmp_path, dataset.bmap)
    try:
        want = {}
        for k in range(2):
            with LoaderSource("train", socket=d.socket, shard_id=k, **KW) as ref:
                want[k] = [_key(*b) for b in _batches(ref, form, 2)]
        srcs = {k: LoaderSource("train", socket=d.socket, shard_id=k, reconnect_timeout=30, **KW) for k in range(2)}
        its = {k: _batches(srcs[k], form, 2) for k in range(2)}
        got: dict[int, list[Any]] = {0: [], 1: []}
        held = []  # batches handed out before the restart, with copies of their bytes
        for k in range(2):
            for _ in range(3):
                b = next(its[k])
                got[k].append(_key(*b))
                held.append((b[0], [bytes(s) for s in b[0]]))
        d.proc.send_signal(sig)
        d.proc.wait(timeout=10)
        restarted: list[Any] = []
        t = threading.Timer(0.5, lambda: restarted.append(start_daemon(tmp_path, dataset.bmap)))
        t.start()
        with pytest.warns(RuntimeWarning, match="reconnecting"):
            for k in range(2):
                got[k] += [_key(*b) for b in its[k]]
        t.join()
        d = restarted[0]
        for k in range(2):
            assert got[k] == want[k], f"shard {k}: the sequence across the restart differs from an uninterrupted one"
            srcs[k].close()
        for arrays, copies in held:
            assert [bytes(s) for s in arrays] == copies, "a batch handed out before the restart changed"
    finally:
        assert stop_daemon(d) == 0


def test_broken_stream_keeps_batches(dataset: Dataset, tmp_path: Path) -> None:
    """A stream whose connection breaks while the daemon lives on: the
    source goes on with the same sequence, and the batches it handed out
    before (still in use, as DALI's no_copy=True uses them) are never
    overwritten by the daemon's reads."""
    d = start_daemon(tmp_path, dataset.bmap)
    try:
        with LoaderSource("train", socket=d.socket, shard_id=0, **KW) as ref:
            want = [_key(*b) for b in _batches(ref, "iter", 2)]
        with LoaderSource("train", socket=d.socket, shard_id=0, reconnect_timeout=30, **KW) as src:
            it = _batches(src, "iter", 2)
            got, held = [], []
            for _ in range(3):
                b = next(it)
                got.append(_key(*b))
                held.append((b[0], [bytes(s) for s in b[0]]))
            time.sleep(0.3)  # the daemon's read-ahead fills every slot it may
            assert src._session.transport.streaming
            old = src._session.id
            src._session.transport._stream._sock.shutdown(socket.SHUT_RDWR)  # the connection breaks
            with pytest.warns(RuntimeWarning, match="reconnecting"):
                got += [_key(*b) for b in it]
            with pytest.raises(NotFoundError):  # the old session is closed, not left to the reaper
                src._session.call("GET", f"/v1/sessions/{old}/state")
            time.sleep(0.3)  # a read into a held slot would land by now
        assert got == want, "the sequence across a broken stream differs from an unbroken one"
        for arrays, copies in held:
            assert [bytes(s) for s in arrays] == copies, "a batch handed out before the stream broke was overwritten"
    finally:
        assert stop_daemon(d) == 0
