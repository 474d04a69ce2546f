# SPDX-License-Identifier: Apache-2.0
"""Connecting says what to do: not in the socket's group names the group
and how to join it; no daemon asks whether loaderd runs there and how to
start it; the socket comes from the argument, NVFEED_SOCKET or the one
default of deploy/."""

from __future__ import annotations

import grp
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any, Callable

import pytest

from asuser import nobody, run_as, shared_dir
from conftest import Dataset, start_daemon, stop_daemon
from nvfeed import (DEFAULT_SOCKET, SOCKET_ENV, DaemonGoneError, DaemonNotRunningError, LoaderError, LoaderSource,
                    SocketPermissionError, backends)

CONNECT = """
import json, sys
import nvfeed as ds
try:
    ds.backends(sys.argv[1] if len(sys.argv) > 1 else None)
    print(json.dumps({"ok": True}))
except ds.LoaderError as e:
    print(json.dumps({"type": type(e).__name__, "msg": str(e), "permission": isinstance(e, PermissionError),
                      "group": getattr(e, "group", None), "gid": getattr(e, "gid", None)}))
"""

OPENERS: dict[str, Callable[[str | None], Any]] = {
    "LoaderSource": lambda sock: LoaderSource("train", socket=sock),
    "backends": lambda sock: backends(sock),
}


def _refusing_socket(path: Path) -> socket.socket:
    """A socket file nobody listens on: connect gets ECONNREFUSED."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    return s


@pytest.mark.parametrize("opener", sorted(OPENERS))
@pytest.mark.parametrize("how", ["missing", "refused"])
def test_no_daemon_asks_whether_it_runs(tmp_path: Path, opener: str, how: str) -> None:
    path = tmp_path / "loaderd.sock"
    held = _refusing_socket(path) if how == "refused" else None
    try:
        with pytest.raises(DaemonNotRunningError) as ei:
            OPENERS[opener](str(path))
    finally:
        if held is not None:
            held.close()
    msg = str(ei.value)
    assert isinstance(ei.value, DaemonGoneError), "a reconnecting source must still retry it"
    assert ei.value.path == str(path)
    for want in (f"is loaderd running at {path}?", "systemctl start loaderd", f"loaderd serve --socket {path}",
                 SOCKET_ENV):
        assert want in msg, f"{want!r} not in {msg!r}"
    assert "Errno" not in msg, msg


def test_socket_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, dataset: Dataset) -> None:
    missing = str(tmp_path / "elsewhere.sock")
    monkeypatch.setenv(SOCKET_ENV, missing)
    with pytest.raises(DaemonNotRunningError, match=f"running at {missing}"):
        LoaderSource("train")
    d = start_daemon(tmp_path, dataset.bmap)
    try:
        monkeypatch.setenv(SOCKET_ENV, d.socket)
        assert backends()["backends"]
        with LoaderSource("train", batch_size=5) as src:
            assert sum(len(b) for b, _ in src) == len(dataset.files)
        with pytest.raises(DaemonNotRunningError, match=f"running at {missing}"):  # the argument wins
            LoaderSource("train", socket=missing)
    finally:
        assert stop_daemon(d) == 0


def test_default_socket_is_deploys(monkeypatch: pytest.MonkeyPatch) -> None:
    assert DEFAULT_SOCKET == "/run/loaderd/loaderd.sock"
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    if os.path.exists(DEFAULT_SOCKET):
        pytest.skip(f"{DEFAULT_SOCKET} exists here: a daemon may be listening")
    with pytest.raises(DaemonNotRunningError, match=f"running at {DEFAULT_SOCKET}"):
        backends()


@pytest.mark.parametrize("kwargs, message", [
    ({"timeout": 0}, "timeout must be a finite number of seconds > 0, got 0"),
    ({"timeout": -1.5}, "timeout must be a finite number of seconds > 0, got -1.5"),
    ({"timeout": float("inf")}, "timeout must be a finite number of seconds > 0, got inf"),
    ({"timeout": None}, "timeout must be a finite number of seconds > 0, got None"),
    ({"reconnect_timeout": -1}, "reconnect_timeout must be a finite number of seconds >= 0 (0 turns reconnection off), got -1"),
])
def test_timeouts_checked_before_connecting(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    """The socket does not exist: a ValueError, not a connect error, shows
    the check came first."""
    with pytest.raises(ValueError) as ei:
        LoaderSource("train", socket=str(tmp_path / "none.sock"), **kwargs)
    assert str(ei.value) == message
    if "reconnect" not in message:
        with pytest.raises(ValueError, match="timeout must be"):
            backends(str(tmp_path / "none.sock"), **kwargs)


def _group() -> grp.struct_group:
    """A group nobody is not in (users, else adm)."""
    for name in ("users", "adm"):
        try:
            return grp.getgrnam(name)
        except KeyError:
            pass
    pytest.skip("neither group users nor adm exists here")
    raise AssertionError("unreachable")


def test_not_in_the_sockets_group(dataset: Dataset) -> None:
    """nobody connects to a socket of mode 0660 whose group it lacks, then
    with the group; then with the socket's group unnamed, then root's
    (never advised to join it), then with its directory unsearchable."""
    who = nobody()
    group = _group()
    base = shared_dir()
    d = start_daemon(base, dataset.bmap, "--socket-group", group.gr_name, "--socket-mode", "0660")
    try:
        r = run_as(who.pw_uid, who.pw_gid, [], CONNECT, d.socket)
        out = json.loads(r.stdout or "{}") if r.returncode == 0 else {"stderr": r.stderr}
        assert out.get("type") == "SocketPermissionError" and out["permission"], out
        assert out["group"] == group.gr_name and out["gid"] == group.gr_gid, out
        for want in (d.socket, f"'{group.gr_name}' (gid {group.gr_gid})", f"sudo usermod -aG {group.gr_name} $USER",
                     "log in again", "mode 0660", "uid 65534"):
            assert want in out["msg"], f"{want!r} not in {out['msg']!r}"
        assert "Errno" not in out["msg"]

        r = run_as(who.pw_uid, who.pw_gid, [group.gr_gid], CONNECT, d.socket)
        assert json.loads(r.stdout) == {"ok": True}, r.stdout + r.stderr

        os.chown(d.socket, -1, 4242)  # a gid with no name here (a container's supplementalGroups)
        r = run_as(who.pw_uid, who.pw_gid, [], CONNECT, d.socket)
        out = json.loads(r.stdout)
        assert out["type"] == "SocketPermissionError" and "gid 4242 (no name on this machine)" in out["msg"], out
        assert "supplementalGroups" in out["msg"] and out["group"] == "4242"

        os.chown(d.socket, -1, 0)  # root's group: as a daemon started without --socket-group
        r = run_as(who.pw_uid, who.pw_gid, [], CONNECT, d.socket)
        out = json.loads(r.stdout)
        assert out["type"] == "SocketPermissionError" and out["gid"] == 0, out
        assert "--socket-group GROUP" in out["msg"] and "only root may connect" in out["msg"], out["msg"]
        assert "usermod" not in out["msg"] and "newgrp" not in out["msg"], f"advises joining root's group: {out['msg']}"

        base.chmod(0o700)  # the daemon's directory, not the socket, keeps it out
        r = run_as(who.pw_uid, who.pw_gid, [4242], CONNECT, d.socket)
        out = json.loads(r.stdout)
        assert out["type"] == "SocketPermissionError" and "cannot search a directory" in out["msg"], out
        assert "0755" in out["msg"] and out["group"] is None
    finally:
        base.chmod(0o755)
        assert stop_daemon(d) == 0, d.log.read_text()
        shutil.rmtree(base)


def test_permission_error_is_a_loader_error() -> None:
    """Callers catching LoaderError or PermissionError both catch it; a
    reconnecting source does not retry it (not a DaemonGoneError)."""
    assert issubclass(SocketPermissionError, LoaderError) and issubclass(SocketPermissionError, PermissionError)
    assert not issubclass(SocketPermissionError, DaemonGoneError)
