"""make wheel: one platform wheel with the client and both binaries, one
version for all three, a manylinux tag that auditwheel agrees with."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import dali_source

from conftest import BIN, Wheel

REPO = Path(__file__).resolve().parents[2]


def test_binaries_and_client_share_one_version() -> None:
    v = (REPO / "python" / "nvfeed" / "VERSION").read_text().strip()
    assert dali_source.__version__ == v
    for b in ("loaderd", "mkbmap"):
        out = subprocess.run([str(BIN / b), "--version"], capture_output=True, text=True, check=True).stdout
        assert out == f"{b} {v}\n", out


def _wheel_name() -> str:
    return f"nvfeed-{dali_source.__version__}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"


def test_make_wheel_needs_no_development_environment() -> None:
    """make wheel runs deps.sh in its wheel mode (Go, objcopy, python3)
    and wheel.sh: no venv, no staticcheck, no test tools."""
    # Under `make test` this is a sub-make: without --no-print-directory it
    # says which directory it enters.
    r = subprocess.run(["make", "--no-print-directory", "-n", "wheel"], cwd=REPO, capture_output=True, text=True,
                       check=True)
    assert r.stdout.split("\n")[:2] == ["bash scripts/deps.sh wheel", "bash scripts/wheel.sh"], r.stdout
    trace = subprocess.run(["bash", "-x", str(REPO / "scripts" / "deps.sh"), "wheel"], cwd=REPO, capture_output=True,
                           text=True, check=True).stderr
    for heavy in ("staticcheck", "venv", "fio", "xfsprogs"):
        assert heavy not in trace, f"deps.sh wheel touches {heavy}"
    assert ".venv" not in (REPO / "scripts" / "wheel.sh").read_text()


def test_readme_names_the_wheel_built() -> None:
    readme = (REPO / "README.md").read_text()
    assert f"dist/{_wheel_name()}" in readme


def test_wheel(wheel: Wheel) -> None:
    """Built with a bare environment: Go, the system's python3, no venv on PATH."""
    assert wheel.path.name == _wheel_name(), wheel.path.name
    v = dali_source.__version__
    show = subprocess.run([str(Path(sys.executable).parent / "auditwheel"), "show", str(wheel.path)], capture_output=True, text=True)
    assert show.returncode == 0, show.stderr
    m = re.search(r'consistent with the following platform tag: "manylinux_(\d+)_(\d+)_x86_64"', show.stdout)
    assert m and (int(m[1]), int(m[2])) <= (2, 17), f"auditwheel does not back manylinux_2_17: {show.stdout}"
    target = wheel.site
    for b in ("loaderd", "mkbmap"):
        out = subprocess.run([str(target / "bin" / b), "--version"], capture_output=True, text=True, check=True).stdout
        assert out == f"{b} {v}\n", f"the wheel's {b}: {out!r}"
    py = subprocess.run([sys.executable, "-c", "import dali_source, sys; print(dali_source.__version__, dali_source.__file__)"],
                        capture_output=True, text=True, env={"PYTHONPATH": str(target)}, cwd="/", check=True).stdout.split()
    assert py[0] == v and py[1].startswith(str(target)), py
