# SPDX-License-Identifier: Apache-2.0
"""The README's Quickstart, followed as an operator would on a CPU-only
machine: a socket group made with groupadd, a socket directory of mode
0755, the dataset mapped with mkbmap, loaderd serving it as a service
would (its own process, the group on the socket, SIGTERM to stop), and a
member of the group (nobody, with the group as a supplementary group)
running the README's CPU pipeline as written, with NVFEED_SOCKET naming
the socket. The binaries and the client are the wheel's, as the README
installs it (`make wheel`, then pip)."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from asuser import nobody, run_as, shared_dir
from conftest import WAIT, REPO, Wheel, skip_unprivileged

FILES, CLASSES = 70, 3


def _readme_block(marker: str) -> str:
    """The README's python block containing marker."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    return next(b for b in blocks if marker in b)


@pytest.fixture
def group() -> Iterator[tuple[str, int]]:
    """A new system group, as the Quickstart's groupadd makes (removed
    after)."""
    if os.geteuid() != 0 or shutil.which("groupadd") is None:
        skip_unprivileged("needs root and groupadd")
    name = f"nvf{uuid.uuid4().hex[:8]}"
    subprocess.run(["groupadd", "--system", name], check=True)
    try:
        import grp
        yield name, grp.getgrnam(name).gr_gid
    finally:
        subprocess.run(["groupdel", name], check=False)


def _jpegs(root: Path) -> None:
    from PIL import Image
    rng = np.random.default_rng(11)
    for i in range(FILES):
        p = root / f"class{i % CLASSES}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        out = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (40 + i % 9, 48, 3), dtype=np.uint8)).save(out, format="JPEG")
        p.write_bytes(out.getvalue())
        p.chmod(0o644)
    (root / "README.txt").write_text("files in the root are not samples")
    for d in [root, *root.iterdir()]:
        if d.is_dir():
            d.chmod(0o755)


def test_quickstart_on_cpu(group: tuple[str, int], wheel: Wheel) -> None:
    gname, gid = group
    user = nobody()
    pytest.importorskip("nvidia.dali", reason="the README's pipeline needs DALI")
    base = shared_dir()
    try:
        # sudo install -d -m 0755 /run/loaderd (here: a directory of its own).
        rundir = base / "run-loaderd"
        rundir.mkdir(mode=0o755)
        rundir.chmod(0o755)
        data = base / "data" / "imagenet"
        data.mkdir(parents=True)
        for d in (base / "data", data):
            d.chmod(0o755)
        _jpegs(data / "train")

        # sudo env "PATH=$PATH" mkbmap --mountpoint ... -o ... (--verify needs the device: not here)
        # The wheel's binaries, on PATH as pip puts them.
        env = {**os.environ, "PATH": f"{wheel.site / 'bin'}:{os.environ['PATH']}"}
        bmap = data / "train.bmap"
        r = subprocess.run(["mkbmap", "--mountpoint", str(data / "train"), "-o", str(bmap)],
                           env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert f"{FILES} samples" in r.stderr, r.stderr

        # sudo env "PATH=$PATH" loaderd serve --socket ... --socket-group loaderd --dataset imagenet=...
        sock = rundir / "loaderd.sock"
        log = base / "loaderd.log"
        daemon = subprocess.Popen(["loaderd", "serve", "--socket", str(sock), "--socket-group", gname,
                                   "--dataset", f"imagenet={bmap}"], env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + WAIT
            while not sock.exists():  # ready when the socket exists
                assert daemon.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.02)
            st = sock.stat()
            assert st.st_gid == gid and st.st_mode & 0o777 == 0o660, oct(st.st_mode)

            where = run_as(user.pw_uid, user.pw_gid, [], "import nvfeed, dali_source; print(nvfeed.__file__, dali_source.__file__)",
                           client=wheel.site)
            files = where.stdout.split()  # the wheel's client, under both names
            assert len(files) == 2 and all(f.startswith(str(wheel.site)) for f in files), where.stdout + where.stderr
            script = "from nvidia.dali import fn, pipeline_def, types\n" + _readme_block('device="cpu"')
            client_env = {"NVFEED_SOCKET": str(sock), "HOME": "/tmp"}
            # Not yet a member: told which group to join.
            r = run_as(user.pw_uid, user.pw_gid, [], script, env=client_env, client=wheel.site)
            assert r.returncode != 0 and "SocketPermissionError" in r.stderr, r.stdout + r.stderr
            assert f"sudo usermod -aG {gname} $USER" in r.stderr, r.stderr
            # A member (after the new login): two epochs of every sample, decoded on the CPU.
            r = run_as(user.pw_uid, user.pw_gid, [gid], script, env=client_env, timeout=300, client=wheel.site)
            assert r.returncode == 0, r.stdout + r.stderr + log.read_text()
            assert r.stdout.split("\n")[:2] == [f"epoch 0: {FILES} samples", f"epoch 1: {FILES} samples"], r.stdout
        finally:
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(timeout=15) == 0, log.read_text()
        assert not sock.exists(), "socket left behind after SIGTERM"
    finally:
        shutil.rmtree(base)
