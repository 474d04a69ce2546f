# SPDX-License-Identifier: Apache-2.0
"""The filesystem's permissions are the access policy: a client is served
a dataset only if it could read every sample itself. Runs a real client as
another user (nobody), so it needs root."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from conftest import BIN, skip_unprivileged, start_daemon, stop_daemon, wait_until
from nvfeed import LoaderError, LoaderSource

CLIENT = """
import hashlib, json, sys
from nvfeed import LoaderError, LoaderSource
out = {}
for name in sys.argv[2:]:
    try:
        with LoaderSource(name, socket=sys.argv[1], batch_size=2) as src:
            out[name] = sorted(hashlib.sha256(s.tobytes()).hexdigest() for b, _ in src for s in b)
    except LoaderError as e:
        out[name] = str(e)
print(json.dumps(out))
"""

STEAL = """
import os, sys
from nvfeed._memory import receive
from nvfeed._upgrade import UpgradeError
n = len(os.listdir("/proc/self/fd"))
try:
    receive(sys.argv[1], sys.argv[2], 10)
    print("GOT the memory")
except UpgradeError as e:
    leaked = len(os.listdir("/proc/self/fd")) - n
    print(f"refused {e.status} {e} leaked={leaked}")
"""


def _dataset(base: Path, name: str) -> tuple[Path, list[str]]:
    root = base / name
    hashes = []
    for i in range(6):
        p = root / f"c{i % 2}" / f"{i}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(2000 + i * 300)
        p.write_bytes(data)
        p.chmod(0o644)
        hashes.append(hashlib.sha256(data).hexdigest())
    for d in (root, root / "c0", root / "c1"):
        d.chmod(0o755)
    return root, sorted(hashes)


def _client_python(uid: int, gid: int) -> list[str]:
    """An interpreter the user can run, with this venv's packages: the
    venv's own often lives under root's home (pyenv), out of reach."""
    site = next(p for p in sys.path if p.endswith("site-packages"))
    env = f"PYTHONPATH={site}"
    for exe in (os.path.realpath(sys.executable), f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"):
        r = subprocess.run(["env", env, exe, "-c", "import nvfeed, numpy, msgpack"], user=uid, group=gid, extra_groups=[],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return ["env", env, exe]
    skip_unprivileged(f"no Python {sys.version_info.major}.{sys.version_info.minor} that uid {uid} can run with {site}")


def _map(root: Path) -> Path:
    out = root.parent / f"{root.name}.bmap"
    r = subprocess.run([str(BIN / "mkbmap"), "--mountpoint", str(root), "-o", str(out)], capture_output=True, text=True)
    if r.returncode != 0:
        skip_unprivileged(f"mkbmap refused {root.parent}'s filesystem: {r.stderr.strip()}")
    return out


@dataclass
class Served:
    """A daemon serving three datasets to root and to nobody, a member of
    its socket's group."""
    socket: str
    nobody: pwd.struct_passwd
    py: list[str]  # an interpreter nobody can run, with this venv's packages
    ok_hashes: list[str]
    secret: Path


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    if os.geteuid() != 0:
        skip_unprivileged("needs root: runs a client as the user nobody")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        skip_unprivileged("no user nobody on this machine")
    base = Path(tempfile.mkdtemp(prefix="nvfeed-access-"))  # /tmp: searchable by everyone
    base.chmod(0o755)
    ok, ok_hashes = _dataset(base, "ok")
    secret, _ = _dataset(base, "secret")
    (secret / "c1" / "3.jpg").chmod(0o600)  # root's own
    locked, _ = _dataset(base, "locked")
    (locked / "c0").chmod(0o700)  # a class directory others cannot search
    maps = {n: _map(r) for n, r in (("ok", ok), ("secret", secret), ("locked", locked))}
    sockdir = base / "run"
    sockdir.mkdir()
    sockdir.chmod(0o755)
    args = [a for n, m in maps.items() for a in ("--dataset", f"{n}={m}")]
    d = start_daemon(sockdir, maps["ok"], *args, "--socket-group", str(nobody.pw_gid))
    try:
        yield Served(d.socket, nobody, _client_python(nobody.pw_uid, nobody.pw_gid), ok_hashes, secret)
    finally:
        assert stop_daemon(d) == 0
        shutil.rmtree(base, ignore_errors=True)


def _as_nobody(s: Served, script: str, *args: str) -> str:
    r = subprocess.run([*s.py, "-c", script, s.socket, *args], user=s.nobody.pw_uid, group=s.nobody.pw_gid,
                       extra_groups=[], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_socket_only_for_its_group(served: Served) -> None:
    st = os.stat(served.socket)
    assert stat.S_IMODE(st.st_mode) & 0o007 == 0, f"socket mode {oct(st.st_mode)}: others may connect"
    assert st.st_gid == served.nobody.pw_gid


def test_readable_dataset_byte_exact(served: Served) -> None:
    got = json.loads(_as_nobody(served, CLIENT, "ok"))
    assert got["ok"] == served.ok_hashes, "a readable dataset was not read byte-exact"


def test_refusal_names_dataset_and_path(served: Served) -> None:
    got = json.loads(_as_nobody(served, CLIENT, "secret", "locked"))
    # A sample the caller may not read fails where it is first read (the
    # open checks only the root), naming the dataset and the path.
    assert "forbidden" in got["secret"] and "dataset secret" in got["secret"] and "secret/c1/3.jpg" in got["secret"] \
        and "permission denied" in got["secret"], got["secret"]
    # A 0700 class folder: its files are not named to someone who could
    # not list it ("c0/…").
    assert "forbidden" in got["locked"] and "dataset locked" in got["locked"] and "locked/c0/…" in got["locked"], \
        got["locked"]


FILES_CLIENT = """
import json, sys
from nvfeed import LoaderError, LoaderSource
out = []
for names in json.loads(sys.argv[2]):
    try:
        with LoaderSource("secret", socket=sys.argv[1], batch_size=2, files=names) as src:
            out.append(sorted(len(s) for b, _ in src for s in b))
    except LoaderError as e:
        out.append(str(e))
print(json.dumps(out))
"""


def test_files_checks_only_the_named(served: Served) -> None:
    """files= (DALI's): nobody reads the named samples of a dataset it may
    not read whole; naming the one file it cannot read fails at open,
    naming that file, as does naming a file the map does not hold."""
    from asuser import run_as
    asked = [["c0/0.jpg", str(served.secret / "c1" / "1.jpg")], ["c0/0.jpg", "c1/3.jpg"], ["c0/0.jpg", "c0/nope.jpg"]]
    r = run_as(served.nobody.pw_uid, served.nobody.pw_gid, [], FILES_CLIENT, served.socket, json.dumps(asked))
    assert r.returncode == 0, r.stderr
    readable, secret, unmapped = json.loads(r.stdout)
    assert readable == sorted([2000, 2300]), readable
    assert isinstance(secret, str) and "HTTP 403" in secret and "secret/c1/3.jpg" in secret, secret
    assert isinstance(unmapped, str) and '"c0/nope.jpg" is not a sample of dataset secret' in unmapped, unmapped


def test_root_reads_everything(served: Served) -> None:
    for name in ("secret", "locked"):
        with LoaderSource(name, socket=served.socket, batch_size=2) as src:
            assert sum(len(b) for b, _ in src) == 6


def test_other_uid_cannot_take_a_sessions_memory(served: Served) -> None:
    """nobody, on the same socket, asks for the memory of root's session by
    its id: refused (403), and no descriptor arrives."""
    with LoaderSource("ok", socket=served.socket, batch_size=2) as src:
        next(src)
        out = _as_nobody(served, STEAL, str(src._session.id))
    assert out.startswith("refused 403") and "belongs to another user" in out, out


def test_loosening_is_seen(served: Served) -> None:
    """Loosening a file's mode drops the cached verdict (runs last: it
    changes the tree)."""
    (served.secret / "c1" / "3.jpg").chmod(0o644)
    wait_until(lambda: isinstance(json.loads(_as_nobody(served, CLIENT, "secret"))["secret"], list),
               "nobody reads the loosened file")


def _get(port: int, path: str, token: str | None) -> int:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
    return c.getresponse().status


def test_tcp_needs_the_token(dataset, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([str(BIN / "loaderd"), "serve", "--socket", str(tmp_path / "x.sock"), "--dataset", f"train={dataset.bmap}",
                        "--listen", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "--tcp-token" in r.stderr, "TCP without a token must be refused"
    tok = tmp_path / "token"
    tok.write_text("s3cret-token\n")
    d = start_daemon(tmp_path, dataset.bmap, "--listen", f"127.0.0.1:{port}", "--tcp-token", str(tok))
    try:
        def listening() -> bool:
            try:
                return _get(port, "/healthz", None) == 401
            except ConnectionRefusedError:
                return False
        wait_until(listening, "the TCP listener answers 401 without a token")
        assert _get(port, "/v1/backends", "wrong") == 401
        assert _get(port, "/v1/backends", "s3cret-token") == 200
        assert _get(port, "/healthz", "s3cret-token") == 200
    finally:
        assert stop_daemon(d) == 0
