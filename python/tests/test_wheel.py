# SPDX-License-Identifier: Apache-2.0
"""make wheel: one platform wheel, nvfeed, with the client (the package
nvfeed, and the module dali_source.py, its DALI external_source shim)
and both binaries, one version for all three, a manylinux tag that
auditwheel agrees with; and pip install ./python, the client alone."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nvfeed

from conftest import BIN, Wheel

REPO = Path(__file__).resolve().parents[2]


def test_binaries_and_client_share_one_version() -> None:
    v = (REPO / "python" / "nvfeed" / "VERSION").read_text().strip()
    assert nvfeed.__version__ == v
    for b in ("loaderd", "mkbmap"):
        out = subprocess.run([str(BIN / b), "--version"], capture_output=True, text=True, check=True).stdout
        assert out == f"{b} {v}\n", out


def _wheel_name() -> str:
    return f"nvfeed-{nvfeed.__version__}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"


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
    v = nvfeed.__version__
    show = subprocess.run([str(Path(sys.executable).parent / "auditwheel"), "show", str(wheel.path)], capture_output=True, text=True)
    assert show.returncode == 0, show.stderr
    m = re.search(r'consistent with the following platform tag: "manylinux_(\d+)_(\d+)_x86_64"', show.stdout)
    assert m and (int(m[1]), int(m[2])) <= (2, 17), f"auditwheel does not back manylinux_2_17: {show.stdout}"
    target = wheel.site
    for b in ("loaderd", "mkbmap"):
        out = subprocess.run([str(target / "bin" / b), "--version"], capture_output=True, text=True, check=True).stdout
        assert out == f"{b} {v}\n", f"the wheel's {b}: {out!r}"
    for name, file in (("nvfeed", "nvfeed/__init__.py"), ("dali_source", "dali_source.py")):
        r = subprocess.run([sys.executable, "-W", "error", "-c", f"import {name}; print({name}.__version__, {name}.__file__)"],
                           capture_output=True, text=True, env={"PYTHONPATH": str(target)}, cwd="/", check=True)
        py = r.stdout.split()
        assert py[0] == v and py[1] == str(target / file) and not r.stderr, (py, r.stderr)
    same = subprocess.run([sys.executable, "-W", "error", "-c", "import dali_source, nvfeed; from dali_source._stream import Stream; "
                           "from dali_source import LoaderSource; import dali_source.dali, nvfeed.dali; "
                           "print(LoaderSource is nvfeed.LoaderSource, Stream is nvfeed._stream.Stream, dali_source.dali is nvfeed.dali)"],
                          capture_output=True, text=True, env={"PYTHONPATH": str(target)}, cwd="/", check=True).stdout
    assert same.split() == ["True", "True", "True"], same


def test_wheel_layout(wheel: Wheel) -> None:
    """The package nvfeed and the module dali_source.py, each file as in
    the checkout; the binaries as scripts; the distribution named nvfeed;
    RECORD listing every file."""
    v = nvfeed.__version__
    with zipfile.ZipFile(wheel.path) as z:
        names = set(z.namelist())
        want = {f"nvfeed/{p.name}" for p in (REPO / "python" / "nvfeed").iterdir()
                if p.suffix == ".py" or p.name in ("py.typed", "VERSION")} | {"dali_source.py"}
        assert "nvfeed/__init__.py" in want and "nvfeed/py.typed" in want
        got = {n for n in names if n.startswith(("nvfeed/", "dali_source"))}
        assert got == want, sorted(got ^ want)
        for n in want:
            assert z.read(n) == (REPO / "python" / n).read_bytes(), n
        assert "nvfeed/VERSION" in names  # one VERSION file
        assert {f"nvfeed-{v}.data/scripts/loaderd", f"nvfeed-{v}.data/scripts/mkbmap"} <= names
        meta = z.read(f"nvfeed-{v}.dist-info/METADATA").decode()
        assert f"Name: nvfeed\nVersion: {v}\n" in meta, meta[:200]
        record = {line.split(",")[0] for line in z.read(f"nvfeed-{v}.dist-info/RECORD").decode().splitlines()}
        assert record == names, sorted(record ^ names)


def test_pip_install_python(tmp_path: Path) -> None:
    """pip install ./python (pyproject.toml): the package nvfeed and the
    module dali_source.py, which imports with no warning."""
    site, src = tmp_path / "site", tmp_path / "python"  # a copy: setuptools builds in the tree it is given
    shutil.copytree(REPO / "python", src, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__",
                                                                         ".*_cache"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-build-isolation",
                        "--target", str(site), str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (site / "dali_source.py").read_bytes() == (REPO / "python" / "dali_source.py").read_bytes()
    assert (site / "nvfeed" / "py.typed").exists() and not (site / "dali_source").exists()
    r = subprocess.run([sys.executable, "-W", "error", "-c", "import dali_source, nvfeed; from dali_source import "
                        "LoaderSource; print(dali_source.__file__, LoaderSource is nvfeed.LoaderSource)"],
                       capture_output=True, text=True, env={"PYTHONPATH": str(site)}, cwd="/")
    assert r.returncode == 0 and not r.stderr, r.stderr
    assert r.stdout.split() == [str(site / "dali_source.py"), "True"], r.stdout
