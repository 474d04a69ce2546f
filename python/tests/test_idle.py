# SPDX-License-Identifier: Apache-2.0
"""A session the daemon closed as idle (``--session-timeout``; the test
daemon's is 2 s) is reopened where it was with a message that says so:
the daemon is up, nothing went away. The case Lightning meets without a
sanity check: a validation ``LoaderDataset`` whose session ``len()``
opened before a training epoch longer than the timeout
(``lightning_idle.py``, real Lightning)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conftest import REPO, Daemon, Dataset, wait_until
from nvfeed import LoaderSource
from nvfeed.torch import LoaderDataset


def _reaped(d: Daemon, sid: str) -> bool:
    """Whether the daemon's log says it closed session sid as idle."""
    return any(f"session={sid}" in ln and "idle for more than" in ln for ln in d.log.read_text().splitlines())


def _ids(batches: list[tuple[list, object]]) -> list[list[str]]:
    return [[hashlib.sha256(s.numpy().tobytes()).hexdigest()[:16] for s in samples] for samples, _ in batches]


def test_reaped_after_len_reopens_and_says_so(daemon: Daemon) -> None:
    fresh = LoaderDataset("train", socket=daemon.socket, batch_size=8, random_shuffle=True, seed=3)
    want = _ids(list(fresh))
    fresh.close()
    ds = LoaderDataset("train", socket=daemon.socket, batch_size=8, random_shuffle=True, seed=3)
    n = len(ds)  # opens the session, which nobody streams yet
    assert ds._passes._src is not None
    sid = ds._passes._src._session.id
    wait_until(lambda: _reaped(daemon, sid), f"session {sid} reaped as idle")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _ids(list(ds))
    ds.close()
    assert len(got) == n and got == want, "the reopened session yields the epoch a fresh one does"
    told = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(told) == 1, told
    msg = told[0]
    assert f"session {sid} was closed as idle at" in msg and "more than 2s with no request" in msg, msg
    assert "daemon is up" in msg and "reopening it at epoch 0 batch 0" in msg, msg
    assert "went away" not in msg, msg


def _take(src: LoaderSource, k: int) -> list[bytes]:
    """The samples of src's next k batches, copied as each arrives."""
    out: list[bytes] = []
    for _ in range(k):
        out += [s.tobytes() for s in next(src)[0]]
    return out


def test_reaped_mid_epoch_reopens_where_it_was(daemon: Daemon) -> None:
    """Over HTTP (no stream keeps the session alive): reaped after 2
    batches, the source goes on at batch 2 of the same epoch."""
    kw = dict(socket=daemon.socket, batch_size=4, transport="http", random_shuffle=True, seed=9)
    with LoaderSource("train", **kw) as src:
        want = _take(src, 4)
    with LoaderSource("train", **kw) as src:
        got = _take(src, 2)
        sid = src._session.id
        wait_until(lambda: _reaped(daemon, sid), f"session {sid} reaped as idle")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got += _take(src, 2)
    assert got == want
    msg = " ".join(str(w.message) for w in caught)
    assert "closed as idle" in msg and "reopening it at epoch 0 batch 2" in msg and "went away" not in msg, msg


def test_lightning_validation_set_reaped_during_training(daemon: Daemon, dataset: Dataset, tmp_path: Path) -> None:
    """Real Lightning, no sanity check: the validation dataset's session,
    opened by len() before training, is reaped while the training epoch
    runs (lightning_idle.py waits for it); validation then reopens it,
    saying the daemon closed it as idle, and sees every sample."""
    pytest.importorskip("lightning")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "python"))
    r = subprocess.run([sys.executable, "-W", "always::RuntimeWarning", str(Path(__file__).parent / "lightning_idle.py"),
                        daemon.socket, str(daemon.log), str(tmp_path)], capture_output=True, text=True, timeout=600,
                       env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "closed as idle" in r.stderr and "reopening it at epoch 0 batch 0" in r.stderr, r.stderr[-3000:]
    assert "went away" not in r.stderr, r.stderr[-3000:]
    seen = [i for ln in (tmp_path / "val.jsonl").read_text().splitlines() for i in json.loads(ln)["ids"]]
    want = sorted(hashlib.sha256((dataset.root / p).read_bytes()).hexdigest()[:16] for p, _ in dataset.files)
    assert sorted(seen) == want
