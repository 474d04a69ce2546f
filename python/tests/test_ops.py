# SPDX-License-Identifier: Apache-2.0
"""Operating the daemon from a client: datasets() describes what is
served (counts only), and loaderd reload serves a re-made map to new
sources while an open source keeps its own."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, Dataset, skip_unprivileged, small_dataset, start_daemon, stop_daemon
from nvfeed import LoaderSource, datasets


def test_datasets_and_reload(dataset: Dataset, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        skip_unprivileged("loaderd reload is for root")
    root, bmap, _ = small_dataset(dataset.root.parent, "ops-reload")
    d = start_daemon(tmp_path, bmap)
    try:
        (info,) = datasets(d.socket)
        assert info["name"] == "train" and info["samples"] == 30 and info["classes"] == 2 and info["added"] == 0
        assert info["bytes"] == sum(p.stat().st_size for p in root.rglob("*.jpg"))
        assert info["fresh"] + info["stale"] + info["filesystem_only"] == 30
        assert not any("/" in str(v) for v in info.values()), f"a path in {info}"

        (root / "c0" / "99.jpg").write_bytes(b"\xff\xd8" * 2000)  # added, then mapped
        os.sync()
        subprocess.run([str(BIN / "mkbmap"), "--mountpoint", str(root), "-o", str(bmap)], check=True, capture_output=True)
        with LoaderSource("train", socket=d.socket, batch_size=1) as old:
            r = subprocess.run([str(BIN / "loaderd"), "reload", "--socket", d.socket], capture_output=True, text=True)
            assert r.returncode == 0 and r.stdout == "train: reloaded, 31 samples\n", r.stdout + r.stderr
            with LoaderSource("train", socket=d.socket, batch_size=1) as new:
                assert len(new) == 31
            assert len(old) == 30 and sum(1 for _ in old) == 30, "the source opened before the reload changed"
        assert datasets(d.socket)[0]["samples"] == 31

        bmap.write_bytes(b"not a map")
        r = subprocess.run([str(BIN / "loaderd"), "reload", "--socket", d.socket], capture_output=True, text=True)
        assert r.returncode == 1 and "train: failed, serving 31 samples as before" in r.stdout, r.stdout + r.stderr
        assert datasets(d.socket)[0]["samples"] == 31
    finally:
        assert stop_daemon(d) == 0, d.log.read_text()


def test_datasets_timeout_checked() -> None:
    with pytest.raises(ValueError):
        datasets("/nonexistent.sock", timeout=0)
