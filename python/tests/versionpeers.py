# SPDX-License-Identifier: Apache-2.0
"""What the version tests talk to: the previous release (loaderd built and
its client's python/ directory, from a pinned commit, once per commit in
a temp directory), a webdataset of tar shards, and services on unix
sockets that are not loaderd (an HTTP server, a banner)."""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import shutil
import socket
import socketserver
import subprocess
import tarfile
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from conftest import REPO, skip_unprivileged

PREVIOUS = "6ba9a289e7aabcd01e4b47ccea864fb7428d853f"
"""The previous release: the last commit before versions were exchanged
(neither its client nor its daemon names one). The window this release
keeps is at least this one, both ways."""


def build_previous() -> Path:
    """The previous release's tree with bin/loaderd built, under the temp
    directory keyed by its commit: built once (by git archive and go
    build), then reused by every test session. Skips (see
    skip_unprivileged) without git, the commit (a shallow clone) or Go."""
    git = shutil.which("git")
    if git is None:
        skip_unprivileged("git is not installed: the previous release cannot be built")
    if subprocess.run([str(git), "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS}^{{commit}}"],
                      capture_output=True).returncode != 0:
        skip_unprivileged(f"commit {PREVIOUS} (the previous release) is not in this clone: clone with full history")
    cache = Path(tempfile.gettempdir()) / f"nvfeed-previous-{PREVIOUS[:16]}"
    if (cache / "bin" / "loaderd").exists():
        return cache
    go = shutil.which("go") or next((g for g in (REPO / ".tools/go/bin/go", Path("/usr/local/go/bin/go")) if g.exists()),
                                    None)
    if go is None:
        skip_unprivileged("go is not installed: the previous release's loaderd cannot be built")
    tmp = Path(tempfile.mkdtemp(prefix=cache.name + "-", dir=cache.parent))
    try:
        tree = subprocess.run([str(git), "-C", str(REPO), "archive", "--format=tar", PREVIOUS], check=True,
                              capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(tree)) as t:
            t.extractall(tmp, filter="data")
        version = (tmp / "python" / "nvfeed" / "VERSION").read_text().strip()
        subprocess.run([str(go), "build", "-ldflags", f"-X main.version={version}", "-o", "bin/", "./cmd/loaderd"],
                       cwd=tmp, check=True, capture_output=True)
        try:
            tmp.rename(cache)  # another session's build may have won: then its tree is the one
        except OSError:
            pass
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return cache


def add_member(t: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    t.addfile(ti, io.BytesIO(data))


def write_shards(root: Path) -> list[tuple[bytes, bytes]]:
    """Two tar shards of samples with a .jpg or .png and a .cls (missing
    every 4th); returns each sample's (image, cls or b"") in order."""
    root.mkdir(parents=True)
    want = []
    for s in range(2):
        with tarfile.open(root / f"part-{s}.tar", "w") as t:
            for j in range(11 + s):
                key = f"k{s}{j:03d}"
                img = hashlib.sha256(key.encode()).digest() * (3 + j)
                add_member(t, f"{key}.{'png' if j % 3 == 2 else 'jpg'}", img)
                cls = str(j % 5).encode() if j % 4 != 3 else b""
                if cls:
                    add_member(t, f"{key}.cls", cls)
                want.append((img, cls))
    os.sync()
    return want


class OtherHTTP(http.server.BaseHTTPRequestHandler):
    """Another HTTP service: a page for every GET, 501 for the rest (as
    python's http.server answers)."""

    server_version = "OtherService/1.0"

    def do_GET(self) -> None:
        body = b"<!DOCTYPE html><html><body><h1>Welcome to another service</h1></body></html>\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self) -> str:
        return "unix"  # a unix socket's peer has no host

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@contextmanager
def serve_http(path: str, handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A real HTTP server on a unix socket at path (listening before this
    yields), stopped after."""
    srv = _UnixHTTPServer(path, handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield path
    finally:
        srv.shutdown()
        srv.server_close()
        t.join()


@contextmanager
def serve_banner(path: str, banner: bytes) -> Iterator[str]:
    """A service that does not speak HTTP on a unix socket at path: it
    writes banner to each connection, reads what comes, and closes it."""
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ls.bind(path)
    ls.listen()

    def each(c: socket.socket) -> None:
        with c:
            c.sendall(banner)
            try:
                c.recv(65536)
            except OSError:
                pass

    def accept() -> None:
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            threading.Thread(target=each, args=(c,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield path
    finally:
        ls.shutdown(socket.SHUT_RDWR)
        ls.close()
        t.join()


