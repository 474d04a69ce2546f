# SPDX-License-Identifier: Apache-2.0
"""Raw-mapped samples the daemon reads through the filesystem (changed
since mapping, say by a chmod -R) are told to the client once: the open's
answer says how many and why, and the source warns once with the fix."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

from conftest import WAIT, Dataset, need_raw, small_dataset, start_daemon, stop_daemon
from nvfeed import LoaderSource, datasets


def test_not_raw_warned_once(dataset: Dataset, tmp_path: Path) -> None:
    need_raw(dataset, "gds")
    root, bmap, _ = small_dataset(dataset.root.parent, "not-raw")
    changed = sorted(root.rglob("*.jpg"))[:3]
    for p in changed:
        os.chmod(p, 0o640)  # after mapping: their ctimes moved
    d = start_daemon(tmp_path, bmap)
    try:
        deadline = time.monotonic() + WAIT
        while datasets(d.socket)[0].get("stale", 0) != 3:  # the checking pass runs after the daemon is ready
            assert time.monotonic() < deadline, datasets(d.socket)
            time.sleep(0.05)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with LoaderSource("train", socket=d.socket, batch_size=4, backend="gds") as src:
                assert sum(len(s) for s, _ in src) == 30, "every sample is still served"
                src._session.reopen(src._session.release_after)  # a reopen (as after a reconnect) does not warn again
                next(src)
            with LoaderSource("train", socket=d.socket, batch_size=4, backend="file") as src:
                next(src)
        msgs = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
        assert len(msgs) == 1, msgs
        assert "3 samples are read through the filesystem, not raw by gds" in msgs[0], msgs[0]
        assert "changed since mapping" in msgs[0] and "mkbmap" in msgs[0], msgs[0]
        assert str(root) not in msgs[0], "a path in the warning"
    finally:
        assert stop_daemon(d) == 0, d.log.read_text()
