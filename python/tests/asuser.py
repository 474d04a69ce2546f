# SPDX-License-Identifier: Apache-2.0
"""Running Python as another user (nobody) with this checkout's client:
the venv's interpreter often lives under root's home (pyenv), out of that
user's reach, so a system interpreter of the same version is given the
venv's packages and this checkout's python/ on PYTHONPATH."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from conftest import skip_unprivileged

PYTHON_DIR = Path(__file__).resolve().parents[1]


def nobody() -> pwd.struct_passwd:
    """The user nobody; skips (see skip_unprivileged) when not root or
    when there is no such user."""
    if os.geteuid() != 0:
        skip_unprivileged("needs root: runs a client as the user nobody")
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        skip_unprivileged("no user nobody on this machine")
        raise


def python_as(uid: int, gid: int, client: Path = PYTHON_DIR) -> list[str]:
    """A command line running Python as uid with the client in directory
    client (default: this checkout's python/) importable, or a skip."""
    site = next(p for p in sys.path if p.endswith("site-packages"))
    env = f"PYTHONPATH={client}:{site}"
    for exe in (os.path.realpath(sys.executable), f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"):
        r = subprocess.run(["env", env, exe, "-c", "import nvfeed, numpy, msgpack"], user=uid, group=gid,
                           extra_groups=[], capture_output=True, text=True, cwd="/")
        if r.returncode == 0:
            return ["env", env, exe]
    skip_unprivileged(f"no Python {sys.version_info.major}.{sys.version_info.minor} that uid {uid} can run with {site}")
    raise AssertionError("unreachable")


def run_as(uid: int, gid: int, groups: Sequence[int], script: str, *args: str,
           env: dict[str, str] | None = None, timeout: float = 120,
           client: Path = PYTHON_DIR) -> subprocess.CompletedProcess[str]:
    """Runs script (python -c) as uid:gid with exactly these supplementary
    groups, the client imported from directory client."""
    extra = [f"{k}={v}" for k, v in (env or {}).items()]
    py = python_as(uid, gid, client)
    return subprocess.run([py[0], *py[1:-1], *extra, py[-1], "-c", script, *args], user=uid, group=gid,
                          extra_groups=list(groups), capture_output=True, text=True, cwd="/", timeout=timeout)


def shared_dir() -> Path:
    """A new directory every user can search (pytest's tmp_path, under a
    0700 directory, is not): the caller removes it."""
    d = Path(tempfile.mkdtemp(prefix="nvfeed-"))
    d.chmod(0o755)
    return d
