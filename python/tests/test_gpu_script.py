# SPDX-License-Identifier: Apache-2.0
"""bench/gpu.sh, the one command for a GPU machine, run whole here against
the CUDA stand-in (`--standin`): the script's own steps (discovery, data,
daemon, every exactness check, cuFile's mode, auto's choice, the leak and
violation report) run on every machine, not first on a GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from conftest import BIN, REPO, skip_unprivileged


def test_gpu_script_standin(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        skip_unprivileged("bench/gpu.sh makes a loop device and serves as root")
    assert (REPO / "internal" / "cuda" / "standin" / "csrc" / "build.sh").exists(), "the CUDA stand-in is missing from this tree"
    for b in ("loaderd", "mkbmap"):
        if not (BIN / b).exists():
            skip_unprivileged(f"bin/{b} missing: run `make test` (it builds the binaries first)")
    if not (BIN / "gendataset").exists():
        go = shutil.which("go") or str(REPO / ".tools" / "go" / "bin" / "go")
        subprocess.run([go, "build", "-o", str(BIN / "gendataset"), "./tools/gendataset"], cwd=REPO, check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "CUFILE_", "NVFEED_CUDA"))}
    env["WORK"] = str(tmp_path)
    r = subprocess.run(["bash", str(REPO / "bench" / "gpu.sh"), "--standin", "128"], capture_output=True, text=True,
                       timeout=600, env=env, cwd=REPO)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "every check passed (against the CUDA stand-in, not a GPU)" in r.stdout, out
    assert "no violation, nothing leaked" in r.stdout, out
    # Both cuFile modes ran, and auto followed them.
    assert "cuFile ran in mode: gds" in r.stdout and "cuFile ran in mode: compat" in r.stdout, out
    # 7 exact runs a mode on a loop device, 5 in a directory (no gds, bam).
    assert "FAILURES" not in r.stdout and r.stdout.count("byte- and label-exact") in (10, 14), out
