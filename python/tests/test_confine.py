# SPDX-License-Identifier: Apache-2.0
"""The daemon in what confines it, for real: a memory cgroup's limit
bounds its batch memory budget (one user's sessions past it are refused
naming the limit, and the kernel never kills the daemon), and a dataset
its service's sandbox hides (systemd's PrivateTmp, made here with a
private mount namespace) is warned of at registration and refused to
users without blaming their access."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import yaml

import numpy as np
import pytest

from asuser import nobody, run_as, shared_dir
from conftest import BIN, REPO, skip_unprivileged, small_dataset, start_daemon, stop_daemon

MEMCG = Path("/sys/fs/cgroup/memory")  # cgroup v1's memory controller
LIMIT = 512 << 20


@contextlib.contextmanager
def _memcg(limit: int) -> Iterator[Path]:
    """A child memory cgroup (v1) limited to limit bytes, removed after."""
    if os.geteuid() != 0:
        skip_unprivileged("needs root: makes a memory cgroup")
    if not (MEMCG / "memory.limit_in_bytes").exists():
        pytest.skip(f"no cgroup v1 memory controller at {MEMCG} (a cgroup v2 machine: the unit test covers its layout)")
    d = Path(tempfile.mkdtemp(prefix="nvfeed-budget-", dir=MEMCG))
    try:
        (d / "memory.limit_in_bytes").write_text(str(limit))
        yield d
    finally:
        for pid in (d / "cgroup.procs").read_text().split():  # the test's own daemon, should it outlive stop_daemon
            os.kill(int(pid), 9)
        d.rmdir()


@pytest.fixture
def memcg() -> Iterator[Path]:
    """A child memory cgroup (v1) limited to 512 MiB."""
    with _memcg(LIMIT) as d:
        yield d


def _in(cg: Path) -> Callable[[], None]:
    """A preexec_fn moving the child into cgroup cg."""
    return lambda: (cg / "cgroup.procs").write_text(str(os.getpid()))


def _big_dataset(parent: Path) -> Path:
    """4096 samples of 8 KiB in 4 classes, readable by all, and its map: a
    batch of 4096 with prefetch_queue_depth 4 takes 256 MiB of batch
    memory (8 slots of 32 MiB), one of 1024 a quarter of it."""
    root = parent / "train"
    rng = np.random.default_rng(3)
    for i in range(4096):
        p = root / f"c{i % 4}" / f"{i:04d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.integers(0, 255, 8192, dtype=np.uint8).tobytes())
    for d, _, names in os.walk(root):
        os.chmod(d, 0o755)
        for n in names:
            os.chmod(os.path.join(d, n), 0o644)
    os.sync()
    bmap = parent / "train.bmap"
    subprocess.run([str(BIN / "mkbmap"), "--mountpoint", str(root), "-o", str(bmap)], check=True, capture_output=True)
    bmap.chmod(0o644)
    return bmap


def _oom_kills(cg: Path) -> int:
    """memory.oom_control's oom_kill count (kernels since 4.13), else
    whether the cgroup is under OOM now."""
    fields = dict(line.split() for line in (cg / "memory.oom_control").read_text().splitlines())
    return int(fields.get("oom_kill", fields["under_oom"]))


def _status(sock: str) -> dict:
    r = subprocess.run([str(BIN / "loaderd"), "status", "--socket", sock, "--json"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# Opens a LoaderSource for each batch size in argv[2:] (prefetch_queue_depth
# 4), keeps it open and takes batches from it so that its slots fill; prints
# what each open came to: "ok" or the error's class and message.
SESSIONS = """
import json, sys
from nvfeed import LoaderError, LoaderSource
out, held = [], []
for bs in map(int, sys.argv[2:]):
    try:
        src = LoaderSource("train", socket=sys.argv[1], batch_size=bs, prefetch_queue_depth=4)
    except LoaderError as e:
        out.append(f"{type(e).__name__}: {e}")
        continue
    held.append(src)
    got = sum(1 for _ in zip(range(3), src))
    out.append(f"ok: {got} batches")
print(json.dumps(out))
for src in held:
    src.close()
"""


def test_cgroup_limit_bounds_the_budget(memcg: Path) -> None:
    """loaderd serve started in a 512 MiB memory cgroup with no budget
    given reports a batch memory budget within the limit, naming it and
    its file; nobody's sessions (batch 1024, then the three batch 4096
    ones that OOM-killed a daemon budgeting half the machine's memory)
    are admitted up to the budget and refused past it with a 507 naming
    the limit; the kernel killed nothing and the daemon still answers."""
    who = nobody()
    work = shared_dir()
    try:
        bmap = _big_dataset(work)
        cg = str(memcg)
        d = start_daemon(work, bmap, "--socket-mode", "0666", preexec_fn=_in(memcg))
        try:
            assert str(d.proc.pid) in (memcg / "cgroup.procs").read_text().split()
            budgets = {b["name"]: b for b in _status(d.socket)["budgets"]}
            locked = budgets["batch_memory"]
            assert 0 < locked["limit"] <= LIMIT - (256 << 20), locked
            assert "memory cgroup's limit of 512 MiB" in locked["source"] and cg in locked["source"], locked
            assert budgets["sample_order_memory"]["limit"] + locked["limit"] <= LIMIT - (256 << 20), budgets
            assert "memory cgroup" in d.log.read_text().split("batch memory budget", 1)[1].split("\n", 1)[0], d.log.read_text()

            out = run_as(who.pw_uid, who.pw_gid, [], SESSIONS, d.socket, "1024", "1024", "1024", "4096", "4096", "4096")
            assert out.returncode == 0, out.stderr
            got = json.loads(out.stdout)
            assert got[0].startswith("ok"), got
            refused = [g for g in got if not g.startswith("ok")]
            assert len(refused) >= 3 and all(not g.startswith("ok") for g in got[3:]), got  # every batch-4096 one
            for r in refused:
                assert r.startswith("NoSpaceError") and "memory cgroup's limit of 512 MiB" in r and cg in r, got
            assert d.proc.poll() is None, d.log.read_text()
            assert _oom_kills(memcg) == 0, (memcg / "memory.oom_control").read_text()
            assert _status(d.socket)["budgets"], "the daemon does not answer"
            print(f"max usage {int((memcg / 'memory.max_usage_in_bytes').read_text()) >> 20} MiB of {LIMIT >> 20}, "
                  f"failcnt {(memcg / 'memory.failcnt').read_text().strip()}, budget {locked['limit'] >> 20} MiB; {got}")
        finally:
            assert stop_daemon(d) == 0, d.log.read_text()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _shipped(which: str) -> tuple[str, int]:
    """A shipped config file's text and the memory limit its deployment
    runs it under: the ConfigMap in the DaemonSet's limits.memory, or
    deploy/loaderd.conf in the systemd unit's MemoryMax."""
    units = {"K": 10**3, "M": 10**6, "G": 10**9, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    if which == "the ConfigMap":
        docs = list(yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "loaderd.yaml").read_text()))
        conf = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["loaderd.conf"]
        q = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
        num, unit = q.rstrip("KMGiT"), q[len(q.rstrip("KMGiT")):]
        return conf, int(num) * units[unit]
    unit_file = (REPO / "deploy" / "systemd" / "loaderd.service").read_text()
    v = next(ln.split("=", 1)[1] for ln in unit_file.splitlines() if ln.startswith("MemoryMax="))
    return (REPO / "deploy" / "loaderd.conf").read_text(), int(v[:-1]) << {"K": 10, "M": 20, "G": 30}[v[-1]]  # systemd: base 1024


@pytest.mark.parametrize("which", ["deploy/loaderd.conf", "the ConfigMap"])
def test_shipped_budgets_fit_their_limit(which: str) -> None:
    """The shipped configs state their memory budgets, and a daemon run
    with one in a memory cgroup of its deployment's limit takes them as
    given, without the warning that they pass the limit; in a cgroup of
    half that limit the same config is warned of, naming the limit."""
    conf_text, limit = _shipped(which)
    conf = dict(ln.split(" = ", 1) for ln in conf_text.splitlines() if " = " in ln and not ln.lstrip().startswith("#"))
    assert int(conf["max-locked-mb"]) > 0 and int(conf["max-sampler-mb"]) > 0, conf
    work = shared_dir()
    try:
        (work / "loaderd.conf").write_text(conf_text)
        _, bmap, _ = small_dataset(work, "train")
        for cg_limit, warned in ((limit, False), (limit // 2, True)):
            with _memcg(cg_limit) as cg:
                d = start_daemon(work, bmap, "--config", str(work / "loaderd.conf"), "--socket-group", "", preexec_fn=_in(cg))
                try:
                    budgets = {b["name"]: b for b in _status(d.socket)["budgets"]}
                finally:
                    assert stop_daemon(d) == 0, d.log.read_text()
                log = d.log.read_text()
                assert budgets["batch_memory"]["limit"] == int(conf["max-locked-mb"]) << 20, budgets
                assert budgets["batch_memory"]["source"] == "--max-locked-mb", budgets
                assert budgets["sample_order_memory"]["limit"] == int(conf["max-sampler-mb"]) << 20, budgets
                assert ("pass the memory cgroup's limit of %d MiB" % (cg_limit >> 20) in log) == warned, log
    finally:
        shutil.rmtree(work, ignore_errors=True)


OPEN = """
import sys
from nvfeed import LoaderError, LoaderSource
try:
    LoaderSource("train", socket=sys.argv[1], batch_size=4).close()
    print("opened")
except LoaderError as e:
    print(f"{type(e).__name__}: {e}")
"""


def test_dataset_the_sandbox_hides(tmp_path: Path) -> None:
    """A dataset under /tmp, served by a daemon whose /tmp is a private
    one (systemd's PrivateTmp: a bind of /tmp/systemd-private-*/tmp over
    /tmp in the service's own mount namespace; made here with unshare):
    registration warns naming the dataset, its root and PrivateTmp=yes,
    at start and at reload; nobody's open is refused naming the sandbox,
    not nobody's access (before: no warning, and a 403 saying nobody may
    not read it: no such file or directory); a map file under /tmp fails
    the start naming PrivateTmp=yes."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        skip_unprivileged("needs root and unshare: runs the daemon in a mount namespace of its own")
    who = nobody()
    data = shared_dir()  # under the host's /tmp: what the daemon will not see
    run = Path(tempfile.mkdtemp(prefix="nvfeed-sandbox-", dir="/run"))  # the socket, log and map: outside /tmp
    run.chmod(0o755)
    private = data / "systemd-private-0123456789abcdef-loaderd.service-Ab12Cd" / "tmp"
    private.mkdir(parents=True)
    private.chmod(0o1777)
    wrap = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", 'mount --bind "$0" /tmp && exec "$@"', str(private)]
    try:
        root, bmap, _ = small_dataset(data, "train")
        for p in (root, *root.iterdir()):
            p.chmod(0o755)
        shutil.copy(bmap, run / "train.bmap")
        (run / "train.bmap").chmod(0o644)
        # The daemon itself lies outside /tmp too: a checkout under /tmp (a
        # CI's clone) is hidden from it as well.
        shutil.copy(BIN / "loaderd", run / "loaderd")
        daemon = str(run / "loaderd")
        d = start_daemon(run, run / "train.bmap", "--socket-mode", "0666", wrap=wrap, binary=daemon)
        try:
            out = run_as(who.pw_uid, who.pw_gid, [], OPEN, d.socket)
            assert out.returncode == 0, out.stderr
            got = out.stdout.strip()
            r = subprocess.run([str(BIN / "loaderd"), "reload", "--socket", d.socket], capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stdout + r.stderr
        finally:
            assert stop_daemon(d) == 0, d.log.read_text()
        log = d.log.read_text()
        warning = f"dataset train: its root {root} is hidden from the daemon: the daemon's service sandbox (systemd PrivateTmp=yes)"
        assert log.count(warning) == 2, log  # at start and at reload
        assert got.startswith("ConflictError") and "PrivateTmp=yes" in got and "not a matter of your access" in got, got
        assert "may not read" not in got, got

        # The map itself under the hidden /tmp: the start fails naming it.
        with pytest.raises(RuntimeError, match=r"hidden from the daemon: the daemon's service sandbox \(systemd PrivateTmp=yes\)"):
            start_daemon(run, bmap, wrap=wrap, binary=daemon)
    finally:
        shutil.rmtree(run, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)
