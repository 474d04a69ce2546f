# SPDX-License-Identifier: Apache-2.0
"""Writes the platform wheel of scripts/wheel.sh: the client package
(nvfeed, and the module dali_source, the DALI external_source shim over
it) and the
two binaries (as scripts), with METADATA, WHEEL and RECORD as the
wheel format (PEP 427, PEP 491) specifies."""

from __future__ import annotations

import argparse
import base64
import hashlib
import stat
import zipfile
from pathlib import Path

NAME = "nvfeed"
PACKAGES = ("nvfeed",)  # python/<package>/, each as it is in the checkout
MODULES = ("dali_source.py",)  # python/<module>, as it is in the checkout
TAG = "py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--version", required=True)
    ap.add_argument("--bin", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    a = ap.parse_args()
    repo = Path(__file__).resolve().parents[1]
    readme = (repo / "python" / "README.md").read_text()
    dist_info = f"{NAME}-{a.version}.dist-info"
    data = f"{NAME}-{a.version}.data"
    files: list[tuple[str, bytes, int]] = []  # (path in the wheel, bytes, mode)
    for pkg in PACKAGES:
        for p in sorted((repo / "python" / pkg).iterdir()):
            if p.suffix == ".py" or p.name in ("py.typed", "VERSION"):
                files.append((f"{pkg}/{p.name}", p.read_bytes(), 0o644))
    for mod in MODULES:
        files.append((mod, (repo / "python" / mod).read_bytes(), 0o644))
    for b in ("loaderd", "mkbmap"):
        files.append((f"{data}/scripts/{b}", (a.bin / b).read_bytes(), 0o755))
    metadata = (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {a.version}\n"
                "Summary: Dataset batches straight from NVMe for DALI: loaderd, mkbmap and the DALI source\n"
                "License: Apache-2.0\nRequires-Python: >=3.9\nRequires-Dist: numpy>=1.22\nRequires-Dist: msgpack>=1.0\n"
                # nvfeed.torch (pyproject.toml's extra, the same range)
                "Provides-Extra: torch\nRequires-Dist: torch>=2.0; extra == \"torch\"\n"
                "Description-Content-Type: text/markdown\n\n" + readme)
    files.append((f"{dist_info}/METADATA", metadata.encode(), 0o644))
    files.append((f"{dist_info}/LICENSE", (repo / "LICENSE").read_bytes(), 0o644))
    wheel = "Wheel-Version: 1.0\nGenerator: nvfeed scripts/mkwheel.py\nRoot-Is-Purelib: false\n"
    wheel += "".join(f"Tag: {t}\n" for t in (f"py3-none-{p}" for p in TAG.split("-", 2)[2].split(".")))
    files.append((f"{dist_info}/WHEEL", wheel.encode(), 0o644))
    record = []
    for path, body, _ in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(body)}")
    record.append(f"{dist_info}/RECORD,,")
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
    a.out.mkdir(parents=True, exist_ok=True)
    target = a.out / f"{NAME}-{a.version}-{TAG}.whl"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for path, body, mode in files:
            info = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, body)
    print(target)


if __name__ == "__main__":
    main()
