# SPDX-License-Identifier: Apache-2.0
"""Real DALI, CPU only: ``mkbmap --reader webdataset`` forms the samples
``fn.readers.webdataset`` forms, in its order.

Shards are written by Python's ``tarfile`` (PAX, its default, and GNU
formats) with what real shards hold and what DALI's reading of them
turns on: samples missing a component, extensions in other cases, a
hidden member, a directory, a name too long for the ustar field (DALI
reads the ustar name: the 100 bytes ``tarfile`` leaves there), a
non-ASCII key, a member without a dot, a key repeated after another.
For each shard count, ``ext`` list (alternatives with ``;``),
``case_sensitive_extensions`` and ``missing_component_behavior``, the
map's samples (``mkbmap samples``) read from the tar by their byte
ranges equal DALI's outputs, sample by sample over one epoch, and
DALI's ``source_info`` names the same member at the same offset; where
DALI refuses (``error`` on an underfull sample) so does the map. No
loop device is needed: the map's ranges are read through the file."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

from conftest import BIN

try:
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def
except Exception as e:  # noqa: BLE001 - any import failure means no DALI here
    pytest.skip(f"cannot import nvidia.dali: {e!r}", allow_module_level=True)


def _add(t: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    t.addfile(ti, io.BytesIO(data))


def _shard(path: Path, first: int, n: int, fmt: int) -> None:
    with tarfile.open(path, "w", format=fmt) as t:
        d = tarfile.TarInfo("sub")
        d.type = tarfile.DIRTYPE
        t.addfile(d)
        for i in range(first, first + n):
            k = f"s{i:05d}"
            if i % 7 != 3:
                _add(t, f"{k}.jpg", bytes([i % 251]) * (50 + i))
            if i % 5 == 1:
                _add(t, f"{k}.PNG", b"png" * (i % 13 + 1))
            if i % 4 != 2:
                _add(t, f"{k}.cls", str(i % 10).encode())
            if i % 9 == 0:
                _add(t, f"{k}.meta.json", json.dumps({"i": i}).encode())
        _add(t, ".hidden.jpg", b"hidden")
        _add(t, "sub/" + "y" * 110 + ".jpg", b"long")  # ustar name truncated
        _add(t, f"s{first:05d}.txt", b"again")  # a key seen earlier: a new sample
        _add(t, "nodot", b"nodot")
        _add(t, "clé.jpg", "non-ascii".encode())


def _dali(paths: list[str], ext: list[str], missing: str, cs: bool, n: Optional[int]) -> list[tuple[list[bytes], list[str]]]:
    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe() -> Any:
        outs = fn.readers.webdataset(paths=paths, ext=ext, missing_component_behavior=missing,
                                     case_sensitive_extensions=cs, name="r")
        return tuple(outs) if isinstance(outs, (list, tuple)) else (outs,)

    p = pipe()
    p.build()
    size = p.epoch_size("r")
    got = []
    for _ in range(size):
        outs = p.run()
        got.append(([np.asarray(o[0]).tobytes() for o in outs], [o[0].source_info() for o in outs]))
    return got


def _mkbmap(tmp: Path, root: Path, ext: list[str], missing: str, cs: bool) -> subprocess.CompletedProcess[str]:
    m = tmp / "m.bmap"
    if not m.exists():
        subprocess.run([str(BIN / "mkbmap"), "--reader", "webdataset", "--mountpoint", str(root), "-o", str(m)], check=True, capture_output=True)
    return subprocess.run([str(BIN / "mkbmap"), "samples", "--ext", ",".join(ext), "--missing", missing,
                           f"--case-sensitive={'true' if cs else 'false'}", str(m)], capture_output=True, text=True)


CASES = [
    (["jpg", "cls"], "empty", True),
    (["jpg", "cls"], "skip", True),
    (["jpg;png", "cls"], "skip", False),
    (["jpg;PNG", "cls;json"], "empty", True),
    (["meta.json"], "skip", True),
    (["cls", "cls"], "skip", True),  # one component filling two outputs: DALI counts it once
    (["jpg", "cls"], "error", True),
    (["txt"], "empty", True),
    (["nodot"], "skip", True),
]


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT], ids=["pax", "gnu"])
@pytest.mark.parametrize("ext,missing,cs", CASES, ids=[f"{'+'.join(c[0])}-{c[1]}-{'cs' if c[2] else 'ci'}" for c in CASES])
def test_webdataset_samples_as_dali(tmp_path: Path, shards: int, fmt: int, ext: list[str], missing: str, cs: bool) -> None:
    root = tmp_path / "shards"
    root.mkdir()
    for s in range(shards):
        _shard(root / f"part-{s:03d}.tar", s * 40, 40, fmt)
    paths = sorted(str(p) for p in root.glob("*.tar"))
    r = _mkbmap(tmp_path, root, ext, missing, cs)
    try:
        want = _dali(paths, ext, missing, cs, None)
    except RuntimeError as e:
        if "nderful" in str(e):  # missing_component_behavior="error"
            assert missing == "error", e
            assert r.returncode != 0 and "underfull sample" in r.stderr, r.stderr
            return
        # No sample left: DALI refuses an empty reader; the map is empty.
        assert "number of input samples: 0" in str(e), e
        assert r.returncode == 0 and r.stdout == "", (r.stderr, r.stdout)
        return
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == len(want), (len(lines), len(want))
    for i, (line, (data, infos)) in enumerate(zip(lines, want)):
        tar = (root / line["shard"]).read_bytes()
        for k, o in enumerate(line["outputs"]):
            if o is None:
                assert data[k] == b"", (i, k, line, infos)
                continue
            off, size, name = o
            assert tar[off:off + size] == data[k], (i, k, line, infos)
            assert infos[k] == f"{root / line['shard']}:{off}:{name}", (i, k, infos[k], line)


def test_index_paths_as_dali(tmp_path: Path) -> None:
    """With DALI's index_paths (made by wds2idx), the map is the index's
    samples, checked against the tar, and equals DALI reading with the
    same indexes; an index of another tar is refused."""
    root = tmp_path / "shards"
    root.mkdir()
    idx = []
    for s in range(2):
        tar = root / f"part-{s:03d}.tar"
        with tarfile.open(tar, "w") as t:
            for i in range(s * 30, s * 30 + 30):
                _add(t, f"k{i:04d}.jpg", bytes([i]) * (10 + i))
                if i % 3:
                    _add(t, f"k{i:04d}.cls", b"%d" % i)
        ix = tmp_path / f"part-{s:03d}.idx"
        subprocess.run([str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "wds2idx"), str(tar), str(ix)], check=True, capture_output=True)
        idx.append(str(ix))
    lst = tmp_path / "idx.txt"
    lst.write_text("\n".join(idx) + "\n")
    m = tmp_path / "m.bmap"
    subprocess.run([str(BIN / "mkbmap"), "--reader", "webdataset", "--mountpoint", str(root), "--index-paths", str(lst), "-o", str(m)], check=True, capture_output=True)
    paths = sorted(str(p) for p in root.glob("*.tar"))
    for ext, missing in ((["jpg", "cls"], "skip"), (["jpg", "cls"], "empty")):

        @pipeline_def(batch_size=1, num_threads=1, device_id=None)
        def pipe() -> Any:
            return tuple(fn.readers.webdataset(paths=paths, index_paths=idx, ext=ext, missing_component_behavior=missing, name="r"))

        p = pipe()
        p.build()
        want = [[np.asarray(o[0]).tobytes() for o in p.run()] for _ in range(p.epoch_size("r"))]
        r = subprocess.run([str(BIN / "mkbmap"), "samples", "--ext", ",".join(ext), "--missing", missing, str(m)], capture_output=True, text=True, check=True)
        lines = [json.loads(x) for x in r.stdout.splitlines()]
        assert len(lines) == len(want)
        for line, data in zip(lines, want):
            tar_bytes = (root / line["shard"]).read_bytes()
            got = [b"" if o is None else tar_bytes[o[0]:o[0] + o[1]] for o in line["outputs"]]
            assert got == data, line
    # An index made for another tar does not describe this one.
    lst.write_text(f"{idx[1]}\n{idx[0]}\n")
    r = subprocess.run([str(BIN / "mkbmap"), "--reader", "webdataset", "--mountpoint", str(root), "--index-paths", str(lst), "-o", str(tmp_path / "bad.bmap")], capture_output=True, text=True)
    assert r.returncode != 0 and "index file" in r.stderr, r.stderr
