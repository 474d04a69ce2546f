# SPDX-License-Identifier: Apache-2.0
"""bench/gpu.sh, the one command for a GPU machine, run whole here against
the CUDA stand-in (`--standin`): the script's own steps (discovery, data,
daemon, every exactness check, cuFile's mode, auto's choice, the speed
rows, the leak and violation report) run on every machine, not first on a
GPU; with the CGO_ENABLED=0 binaries it carries there, and without DALI
(which a GPU machine may lack: a shim makes `import nvidia.dali` fail)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, skip_unprivileged

# Makes nvidia.dali unimportable in every Python process the script starts
# (PYTHONPATH is searched before site-packages); with GPU_TEST_HANG=ROW,
# `gpu_check.py speed --row ROW` sleeps instead of measuring: a row that
# hangs, as a stuck cuFile driver open does.
SITECUSTOMIZE = '''
import os, sys, time
class _NoDali:
    def find_spec(self, name, path=None, target=None):
        if name == "nvidia.dali" or name.startswith("nvidia.dali."):
            raise ModuleNotFoundError(f"No module named {name!r} (made unimportable by the test)", name=name)
        return None
sys.meta_path.insert(0, _NoDali())
_hang = os.environ.get("GPU_TEST_HANG")
_a = sys.argv
if _hang and _a[0].endswith("gpu_check.py") and "--row" in _a[:-1] and _a[_a.index("--row") + 1] == _hang:
    time.sleep(3600)
'''


@pytest.fixture(scope="module")
def static_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """loaderd, mkbmap and gendataset built as the script's header says for
    the GPU machine: CGO_ENABLED=0, -trimpath."""
    if os.geteuid() != 0:
        skip_unprivileged("bench/gpu.sh makes a loop device and serves as root")
    go = shutil.which("go") or str(REPO / ".tools" / "go" / "bin" / "go")
    bin_dir = tmp_path_factory.mktemp("bin")
    version = (REPO / "python" / "nvfeed" / "VERSION").read_text().strip()
    subprocess.run([go, "build", "-trimpath", "-ldflags", f"-X main.version={version}", "-o", str(bin_dir) + "/",
                    "./cmd/loaderd", "./cmd/mkbmap", "./tools/gendataset"], cwd=REPO, check=True, timeout=600,
                   env={**os.environ, "CGO_ENABLED": "0", "GOOS": "linux"})
    return bin_dir


def _run(tmp_path: Path, bin_dir: Path, *args: str, **extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """bench/gpu.sh --standin with the CGO_ENABLED=0 binaries, no DALI, and
    its work folder under one that others may write (not sticky): the
    stand-in's library folder is then one loaderd's discovery refuses."""
    assert (REPO / "internal" / "cuda" / "standin" / "csrc" / "build.sh").exists(), "the CUDA stand-in is missing from this tree"
    shim = tmp_path / "nodali"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # others may write it, not sticky: what is under it is refused
    work = open_dir / "work"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "CUFILE_", "NVFEED_CUDA", "GPU_"))}
    env.update(WORK=str(work), GPU_BIN=str(bin_dir), GPU_RESULTS=str(tmp_path / "results"),
               PYTHONPATH=str(shim), PYTHONUNBUFFERED="1", **extra)
    env.pop("OUT", None)
    r = subprocess.run(["bash", str(REPO / "bench" / "gpu.sh"), "--standin", *args], capture_output=True, text=True,
                       timeout=900, env=env, cwd=REPO)
    return r, tmp_path / "results"


def _steps(out: str) -> tuple[list[str], int]:
    """The steps the script announced with their limits, and the count its
    summary gives."""
    steps = re.findall(r"^   \[step (\S.*?): limit (\d+)s\]$", out, re.M)
    m = re.search(r"^== steps: (\d+), each under a time limit", out, re.M)
    assert m, out
    assert all(int(lim) > 0 for _, lim in steps), steps
    return [s for s, _ in steps], int(m.group(1))


def test_gpu_script_standin(tmp_path: Path, static_bin: Path) -> None:
    r, results = _run(tmp_path, static_bin, "128")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "every check passed (against the CUDA stand-in, not a GPU)" in r.stdout, out
    assert "no violation, nothing leaked" in r.stdout, out
    # The binaries it ran are the CGO_ENABLED=0 ones; DALI did not import.
    assert re.search(r"^== \S+/loaderd: built with CGO_ENABLED=0$", r.stdout, re.M), out
    assert "nvidia.dali: not importable" in r.stdout, out
    # The refused library folder was copied to a root-owned one and used.
    assert "would be refused by loaderd's discovery" in r.stdout, out
    m = re.search(r"^   copied .* to (/\S+) \(root's, 0755\): passing that instead$", r.stdout, re.M)
    assert m, out
    assert not Path(m.group(1)).exists(), "the copied libraries outlived the run"
    # Every step ran under a limit, none hung, none was skipped.
    steps, n = _steps(r.stdout)
    assert len(steps) == n and n >= 30, (steps, n)
    assert "hung: none; skipped (budget or GPU_LIMITS): none" in r.stdout, out
    for s in ("standin-build", "check", "mkbmap-train", "exact:train/cufile", "cufile-mode", "speed:cufile",
              "speed:baseline", "standin-report"):
        assert s in steps, (s, steps)
    # Both cuFile modes ran, and auto followed them.
    assert "cuFile ran in mode: gds" in r.stdout and "cuFile ran in mode: compat" in r.stdout, out
    # 9 exact runs a mode on a loop device (file, gds, bam, cufile; 2 dense;
    # 2 numpy; auto), 7 in a directory (no gds, bam).
    assert "FAILURES" not in r.stdout and r.stdout.count("byte- and label-exact") in (14, 18), out
    # Dense batches without DALI: the numpy set's one (batch, *shape) array.
    assert re.search(r"^npy \S+ bounce dense \(.*\): 128 samples, byte- and label-exact", r.stdout, re.M), out
    assert re.search(r"^npy cufile cufile dense \(.*\): 128 samples, byte- and label-exact", r.stdout, re.M), out
    # It ends with figures: each loaderd row has one; the baseline (no GPU
    # here) says why it has none; the logs were collected.
    figures = r.stdout[r.stdout.index("== figures"):]
    for row in (r"gpu cufile", r"gpu \S+ bounce", r"host \S+"):
        assert re.search(rf"^\s+{row}\s+\d+ samples/s", figures, re.M), (row, figures)
    assert re.search(r"read \+ copy to GPU\s+no figure: ", figures), figures
    assert (results / "loaderd.log").stat().st_size > 0 and (results / "speed.jsonl").exists()


def test_gpu_script_hung_step(tmp_path: Path, static_bin: Path) -> None:
    """A step that hangs (the cuFile speed row, here made to sleep) is
    killed at its limit and reported with the logs; the daemon is
    restarted, the other rows still give figures, and the run ends with
    them and FAILURES. (The exactness runs are skipped with GPU_LIMITS,
    which is a failure of its own: this run is about the hang.)"""
    r, _ = _run(tmp_path, static_bin, "64", GPU_TEST_HANG="cufile", TENSOR_SIZES="",
                GPU_LIMITS="exact:*=0 cufile-mode=0 speed:cufile=4")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "gpu: step speed:cufile HUNG: not done within its 4s limit, killed; the script goes on" in r.stdout, out
    after = r.stdout[r.stdout.index("step speed:cufile HUNG"):]
    assert "loaderd.log (tail)" in after.split("\n   [step")[0], after
    assert "(restarting loaderd after a hung step)" in after, out
    figures = r.stdout[r.stdout.index("== figures"):]
    assert re.search(r"^\s+gpu cufile\s+no figure: hung", figures, re.M), figures
    for row in (r"gpu \S+ bounce", r"host \S+"):
        assert re.search(rf"^\s+{row}\s+\d+ samples/s", figures, re.M), (row, figures)
    assert "hung: speed:cufile;" in r.stdout, out
    assert r.stdout.rstrip().endswith("gpu: FAILURES (above) (against the CUDA stand-in, not a GPU)"), out


def test_gpu_script_cufile_not_possible(tmp_path: Path, static_bin: Path) -> None:
    """A host without cuFile's preconditions, as the first GPU machine in
    a container may be (STANDIN_CUFILE_HOST=bare: no modules list, no udev
    record of the data's device): the explicit cufile steps fail, the
    daemon refusing them, and each is reported "not possible here" naming
    why; auto takes bounce; bounce and auto pass; the verdicts say so per
    path and the headline is not FAILURES (before: FAILURES, the cufile
    steps counted as failures)."""
    r, _ = _run(tmp_path, static_bin, "64", STANDIN_CUFILE_HOST="bare", TENSOR_SIZES="")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert not re.search(r"^gpu: (FAILURES|FAILED)", r.stdout, re.M), out
    why = r"no \S+/modules: the daemon refuses to open cuFile, whose driver open would hang; no udev record \S+: cuFile refuses the data's files \(5027\)"
    assert re.search(rf"^   exact:train/cufile: not possible here: {why}$", r.stdout, re.M), out
    verdicts = r.stdout[r.stdout.index("== verdicts per path"):]
    assert re.search(rf"^   cufile: not possible here: {why} \(failed as expected: exact:train/cufile ", verdicts, re.M), verdicts
    assert re.search(r"^   bounce: passed: exact:train/\S+/bounce ", verdicts, re.M), verdicts
    assert re.search(r"^   auto: passed: exact:train/auto", verdicts, re.M), verdicts
    assert "FAILED" not in verdicts, verdicts
    assert re.search(rf"^gpu: every check this host can run passed; not possible here: cufile \({why}\) "
                     r"\(against the CUDA stand-in, not a GPU\)$", r.stdout, re.M), out
