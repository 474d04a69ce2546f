# SPDX-License-Identifier: Apache-2.0
"""A socket that is not loaderd's: another HTTP service (a real
http.server on a unix socket) and a service that does not speak HTTP (an
SSH-like banner). The client's calls and ``loaderd status`` each say the
socket answered, but not as loaderd, and what it answered: a
``NotLoaderdError``, not a msgpack decoding error or a daemon gone."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest

import nvfeed
from conftest import BIN, skip_unprivileged
from nvfeed import LoaderSource, NotLoaderdError
from versionpeers import OtherHTTP, serve_banner, serve_http

CALLS: dict[str, Callable[[str], Any]] = {
    "backends": lambda sock: nvfeed.backends(sock, timeout=30),
    "datasets": lambda sock: nvfeed.datasets(sock, timeout=30),
    "daemon_version": lambda sock: nvfeed.daemon_version(sock, timeout=30),
    "LoaderSource": lambda sock: LoaderSource("train", socket=sock, batch_size=4, timeout=30),
}


def _status(sock: str) -> subprocess.CompletedProcess[str]:
    if not (BIN / "loaderd").exists():
        skip_unprivileged("bin/loaderd missing: run `make test` (it builds the binaries first)")
    return subprocess.run([str(BIN / "loaderd"), "status", "--socket", sock], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("call", list(CALLS))
def test_another_http_service(tmp_path: Path, call: str) -> None:
    with serve_http(str(tmp_path / "web.sock"), OtherHTTP) as sock:
        with pytest.raises(NotLoaderdError) as e:
            CALLS[call](sock)
    msg = str(e.value)
    assert msg.startswith(f"the socket at {sock} answered, but not as loaderd: an HTTP service answered "), msg
    assert "(Server: OtherService/1.0" in msg and ("Welcome to another service" in msg or "501" in msg), msg
    assert e.value.path == sock and not isinstance(e.value, nvfeed.DaemonGoneError)


@pytest.mark.parametrize("call", list(CALLS))
def test_a_service_that_is_not_http(tmp_path: Path, call: str) -> None:
    with serve_banner(str(tmp_path / "ssh.sock"), b"SSH-2.0-OpenSSH_9.2\r\n") as sock:
        with pytest.raises(NotLoaderdError) as e:
            CALLS[call](sock)
    assert str(e.value).startswith(f"the socket at {sock} answered, but not as loaderd: it does not speak HTTP; "
                                   "it wrote 'SSH-2.0-OpenSSH_9.2'"), str(e.value)


def test_loaderd_status_there(tmp_path: Path) -> None:
    with serve_http(str(tmp_path / "web.sock"), OtherHTTP) as web:
        r = _status(web)
    assert r.returncode != 0
    assert f"the socket at {web} answered, but not as loaderd: an HTTP service answered 200 OK, text/html" in r.stderr, \
        r.stderr
    assert "Welcome to another service" in r.stderr and "msgpack" not in r.stderr, r.stderr
    with serve_banner(str(tmp_path / "ssh.sock"), b"SSH-2.0-OpenSSH_9.2\r\n") as ssh:
        r = _status(ssh)
    assert r.returncode != 0
    assert f"the socket at {ssh} answered, but not as loaderd: it does not speak HTTP; it wrote " \
           '"SSH-2.0-OpenSSH_9.2"' in r.stderr, r.stderr
