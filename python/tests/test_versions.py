# SPDX-License-Identifier: Apache-2.0
"""Versions across releases, both ways, with real daemons on real
sockets: this client against the previous release's loaderd (built from
its pinned commit, versionpeers.PREVIOUS) opens sessions and reads the
right batches of a file dataset and a webdataset; the previous release's
client (its python/ directory in a subprocess) against this loaderd does
too. A daemon that lacks a feature a request needs, one older than the
window, and a client older than the daemon serves each get a
``VersionError`` naming both versions and what to upgrade."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import msgpack
import pytest

import nvfeed
import nvfeed._version
from conftest import BIN, Daemon, Dataset, start_daemon, stop_daemon
from nvfeed import LoaderError, LoaderSource, VersionError
from versionpeers import PREVIOUS, build_previous, serve_http, write_shards


@pytest.fixture(scope="module")
def previous() -> Path:
    return build_previous()


@pytest.fixture(scope="module")
def wds(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[bytes, bytes]]]:
    """A webdataset's map and its samples' (image, cls) in order."""
    root = dataset.root.parent / "wds-versions"
    want = write_shards(root)
    bmap = tmp_path_factory.mktemp("wdsmap") / "wds.bmap"
    subprocess.run([str(BIN / "mkbmap"), "--reader", "webdataset", "--mountpoint", str(root), "-o", str(bmap)],
                   check=True, capture_output=True)
    return bmap, want


def _daemon(exe: Path, tmp: Path, dataset: Dataset, wds_map: Path) -> Iterator[Daemon]:
    """exe's loaderd serving train and wds (start_daemon's, from its bin/)."""
    d = start_daemon(tmp, dataset.bmap, "--dataset", f"wds={wds_map}", binary=os.path.relpath(exe, BIN))
    yield d
    assert stop_daemon(d) == 0, d.log.read_text()


@pytest.fixture(scope="module")
def old_daemon(previous: Path, dataset: Dataset, wds: tuple[Path, Any],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    yield from _daemon(previous / "bin" / "loaderd", tmp_path_factory.mktemp("old"), dataset, wds[0])


@pytest.fixture(scope="module")
def new_daemon(dataset: Dataset, wds: tuple[Path, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    yield from _daemon(BIN / "loaderd", tmp_path_factory.mktemp("new"), dataset, wds[0])


def _file_epoch(sock: str) -> list[tuple[str, int]]:
    """An epoch of train through this client: each sample's hash and label."""
    with LoaderSource("train", socket=sock, batch_size=8) as src:
        return [(hashlib.sha256(s.tobytes()).hexdigest(), int(lbl[0])) for samples, labels in src
                for s, lbl in zip(samples, labels)]


def _wds_epoch(sock: str) -> list[tuple[bytes, bytes]]:
    with LoaderSource("wds", socket=sock, batch_size=5, ext=["jpg;png", "cls"]) as src:
        return [(a.tobytes(), b.tobytes()) for imgs, cls in src for a, b in zip(imgs, cls)]


def _check_file(got: list[tuple[str, int]], dataset: Dataset) -> None:
    """An unshuffled epoch: the dataset's files in DALI's order, each its
    label (the last batch filled from the next epoch's start)."""
    assert len(got) >= len(dataset.files)
    assert [(dataset.by_hash[h][0], lbl) for h, lbl in got[:len(dataset.files)]] == dataset.files


def test_this_client_reads_from_the_previous_daemon(old_daemon: Daemon, dataset: Dataset,
                                                    wds: tuple[Path, list[tuple[bytes, bytes]]]) -> None:
    v = nvfeed.daemon_version(old_daemon.socket)
    assert (v.protocol, v.release) == (1, "") and "webdataset" in v.features, v
    assert "sends no version" in str(v)
    _check_file(_file_epoch(old_daemon.socket), dataset)
    got = _wds_epoch(old_daemon.socket)
    assert got[:len(wds[1])] == wds[1]  # unshuffled: shard and member order


def test_a_resume_on_other_ranks_refused_by_the_previous_daemon(old_daemon: Daemon) -> None:
    """A state resumed on other shards (its stages) is refused by a daemon
    from before them, saying to upgrade: never read as a whole epoch."""
    with LoaderSource("train", socket=old_daemon.socket, batch_size=4, shard_id=0, num_shards=4) as src:
        next(iter(src))
        st = src.state()
    with pytest.raises(LoaderError, match="does not know the key 'stages'.*Upgrade loaderd"):
        LoaderSource("train", socket=old_daemon.socket, batch_size=4, shard_id=0, num_shards=2, state=st)


def test_this_daemon_serves_the_previous_client(previous: Path, new_daemon: Daemon, dataset: Dataset,
                                                wds: tuple[Path, list[tuple[bytes, bytes]]]) -> None:
    script = """
import hashlib, json, sys
import nvfeed
from nvfeed import LoaderSource
sock = sys.argv[1]
out = {"module": nvfeed.__file__, "file": [], "wds": []}
with LoaderSource("train", socket=sock, batch_size=8) as src:
    for samples, labels in src:
        out["file"] += [[hashlib.sha256(s.tobytes()).hexdigest(), int(l[0])] for s, l in zip(samples, labels)]
with LoaderSource("wds", socket=sock, batch_size=5, ext=["jpg;png", "cls"]) as src:
    for imgs, cls in src:
        out["wds"] += [[a.tobytes().hex(), b.tobytes().hex()] for a, b in zip(imgs, cls)]
print(json.dumps(out))
"""
    env = {**os.environ, "PYTHONPATH": str(previous / "python")}
    # cwd: python -c puts it first on sys.path, before PYTHONPATH (the
    # suite runs from python/, where this client is).
    r = subprocess.run([sys.executable, "-c", script, new_daemon.socket], capture_output=True, text=True, env=env,
                       timeout=300, cwd=previous)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["module"].startswith(str(previous)), out["module"]  # the previous release's client ran
    _check_file([(h, lbl) for h, lbl in out["file"]], dataset)
    assert [(bytes.fromhex(a), bytes.fromhex(b)) for a, b in out["wds"]][:len(wds[1])] == wds[1]
    # What it was answered names this daemon's version.
    v = nvfeed.daemon_version(new_daemon.socket)
    assert (v.protocol, v.release) == (nvfeed._version.PROTOCOL, nvfeed.__version__) and "webdataset" in v.features


def test_a_client_older_than_the_daemon_serves(new_daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    daemon = nvfeed._version.PROTOCOL
    monkeypatch.setattr(nvfeed._version, "PROTOCOL", 0)
    with pytest.raises(VersionError, match=rf"nvfeed .* \(protocol 0\).*loaderd .* \(protocol {daemon}\).*upgrade the client"):
        nvfeed.backends(new_daemon.socket)


class _Daemon(http.server.BaseHTTPRequestHandler):
    """A loaderd double over real HTTP: GET /v1/backends answers msgpack
    with the class's headers; POST /v1/sessions records its body and
    answers the class's refusal."""

    headers_out: dict[str, str] = {}
    refusal = "not this one"
    opens: list[Any] = []

    def _send(self, status: int, obj: Any) -> None:
        body = msgpack.packb(obj)
        self.send_response(status)
        self.send_header("Content-Type", "application/msgpack")
        self.send_header("Content-Length", str(len(body)))
        for k, v in self.headers_out.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(200, {"default": "file", "auto": "gds", "prefetch_queue_depth": 2, "backends": []})

    def do_POST(self) -> None:
        self.opens.append(msgpack.unpackb(self.rfile.read(int(self.headers["Content-Length"]))))
        self._send(400, {"error": self.refusal, "code": "invalid"})

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_feature_the_daemon_lacks(tmp_path: Path) -> None:
    """A daemon of protocol 2 that lists no webdataset: a webdataset
    session is refused before it is sent, naming both versions; a file
    session goes, without the keys of features it lacks that are at
    their defaults."""
    class NoWds(_Daemon):
        headers_out = {"Nvfeed-Protocol": "2", "Nvfeed-Release": "0.2.9", "Nvfeed-Features": "file,numpy,stream"}
        opens: list[Any] = []

    with serve_http(str(tmp_path / "d.sock"), NoWds) as sock:
        with pytest.raises(VersionError, match=r"loaderd 0\.2\.9 \(protocol 2\), which lacks the feature 'webdataset'"
                                               rf".*nvfeed .* \(protocol {nvfeed._version.PROTOCOL}\).*upgrade loaderd") as e:
            LoaderSource("wds", socket=sock, batch_size=4, ext=["jpg"])
        assert e.value.error_code == "version" and not NoWds.opens
        with pytest.raises(nvfeed.BadRequestError, match="not this one"):
            LoaderSource("train", socket=sock, batch_size=4)
        assert len(NoWds.opens) == 1 and "shuffle_after_epoch" not in NoWds.opens[0], NoWds.opens
        with pytest.raises(VersionError, match="lacks the feature 'shuffle_after_epoch'"):
            LoaderSource("train", socket=sock, batch_size=4, shuffle_after_epoch=True)


def test_a_daemon_older_than_the_window(tmp_path: Path) -> None:
    """A daemon that names no version and does not know a key this client
    sends (as loaderd before shuffle_after_epoch): its refusal becomes a
    VersionError naming both sides and saying to upgrade loaderd."""
    class Older(_Daemon):
        refusal = 'invalid request: malformed msgpack request: msgpack: unknown field "shuffle_after_epoch"'
        opens: list[Any] = []

    with serve_http(str(tmp_path / "d.sock"), Older) as sock:
        with pytest.raises(VersionError, match=r"does not know the key 'shuffle_after_epoch' that this client, "
                                               rf"nvfeed .* \(protocol {nvfeed._version.PROTOCOL}\), sent.*older than protocol 1.*Upgrade loaderd"):
            LoaderSource("train", socket=sock, batch_size=4)


def test_previous_is_pinned() -> None:
    """The pinned commit is a full hash (a branch name would move)."""
    assert len(PREVIOUS) == 40 and int(PREVIOUS, 16) >= 0


def test_a_state_with_content_on_the_previous_daemon(old_daemon: Daemon, new_daemon: Daemon, dataset: Dataset) -> None:
    """A state taken through this daemon carries the dataset's content
    (docs/resume.md, Across nodes). The previous daemon, without feature
    content, gets it without (it would refuse the key), with a warning
    that its copy is not checked, and resumes at the state's position."""
    with LoaderSource("train", socket=new_daemon.socket, batch_size=8) as src:
        it = iter(src)
        next(it)
        st = src.state()
        rest = [hashlib.sha256(s.tobytes()).hexdigest() for samples, _ in it for s in samples]
    assert st["content"] is not None and st["content"]["samples"] == len(dataset.files)
    with pytest.warns(RuntimeWarning, match="lacks the feature 'content'.*Resuming unchecked"):
        old = LoaderSource("train", socket=old_daemon.socket, batch_size=8, state=st)
    with old:
        got = [hashlib.sha256(s.tobytes()).hexdigest() for samples, _ in old for s in samples]
    assert got == rest


SHUFFLED = dict(batch_size=8, random_shuffle=True, seed=5)
"""A shuffled file session (shuffle="permute"), whose order version 4 of
the daemon's state changed: computed, no longer listed."""


def _hashes(src: LoaderSource) -> list[str]:
    return [hashlib.sha256(s.tobytes()).hexdigest() for samples, _ in src for s in samples]


def test_a_previous_state_keeps_its_order_on_this_daemon(old_daemon: Daemon, new_daemon: Daemon) -> None:
    """A shuffled state the previous daemon made (version 2: the listed
    permutation) resumes on this daemon in its own order, the rest of the
    epoch the previous daemon would have read; the states this daemon
    then saves say version 2, so the run keeps that order."""
    with LoaderSource("train", socket=old_daemon.socket, **SHUFFLED) as src:  # type: ignore[arg-type]
        it = iter(src)
        next(it)
        st = src.state()
        rest = [hashlib.sha256(s.tobytes()).hexdigest() for samples, _ in it for s in samples]
    assert st["version"] == 2
    with LoaderSource("train", socket=new_daemon.socket, state=st, **SHUFFLED) as new:  # type: ignore[arg-type]
        it = iter(new)
        first = next(it)
        assert new.state()["version"] == 2
        got = [hashlib.sha256(s.tobytes()).hexdigest() for s in first[0]]
        got += [hashlib.sha256(s.tobytes()).hexdigest() for samples, _ in it for s in samples]
    assert got == rest


def test_the_previous_client_opens_in_the_computed_order(previous: Path, old_daemon: Daemon, new_daemon: Daemon) -> None:
    """The previous client's fresh shuffled open on this daemon reads the
    computed order (as this client's does: a fresh run may), not the
    previous daemon's listed one, and its states say version 4."""
    script = """
import hashlib, json, sys
from nvfeed import LoaderSource
with LoaderSource("train", socket=sys.argv[1], batch_size=8, random_shuffle=True, seed=5) as src:
    out = [hashlib.sha256(s.tobytes()).hexdigest() for samples, _ in src for s in samples]
    version = src.state()["version"]
print(json.dumps({"epoch": out, "version": version}))
"""
    env = {**os.environ, "PYTHONPATH": str(previous / "python")}
    r = subprocess.run([sys.executable, "-c", script, new_daemon.socket], capture_output=True, text=True, env=env,
                       timeout=300, cwd=previous)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    with LoaderSource("train", socket=new_daemon.socket, **SHUFFLED) as src:  # type: ignore[arg-type]
        assert out["epoch"] == _hashes(src)
    with LoaderSource("train", socket=old_daemon.socket, **SHUFFLED) as src:  # type: ignore[arg-type]
        listed = _hashes(src)
    assert sorted(out["epoch"]) == sorted(listed) and out["epoch"] != listed
    assert out["version"] == 4
