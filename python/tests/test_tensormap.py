# SPDX-License-Identifier: Apache-2.0
"""Real DALI, CPU only: the block maps mkbmap makes list the samples DALI's
readers return, in the same order.

- fn.readers.file(file_root=, file_list=) and (files=, labels=): the same
  files (by path and by bytes) and the same labels.
- fn.readers.numpy(file_root=, file_filter=) and (file_list=): the same
  files, and each map sample's dtype, shape and data bytes (the file's
  bytes [offset, offset+size), what the raw readers serve) are the array
  DALI returns, and np.load's.

No daemon: the maps are read back with `mkbmap inspect --format json`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import BIN, skip_unprivileged

try:
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def
except Exception as e:  # noqa: BLE001 - any import failure means no DALI here
    pytest.skip(f"cannot import nvidia.dali: {e!r}", allow_module_level=True)


def mkbmap(*args: str) -> dict[str, Any]:
    """Runs mkbmap with args, returns the map as JSON."""
    exe = BIN / "mkbmap"
    if not exe.exists():
        skip_unprivileged("bin/mkbmap missing: run `make build` (or `make test`) first")
    out = Path(args[args.index("-o") + 1])
    r = subprocess.run([str(exe), *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    j = subprocess.run([str(exe), "inspect", "--format", "json", str(out)], capture_output=True, text=True, check=True)
    return json.loads(j.stdout)


def run_reader(reader, **kw) -> list[tuple[str, np.ndarray, int | None]]:
    """One epoch of a DALI reader: (source_info, array, label) per sample."""
    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():
        out = reader(**kw, name="r")
        return tuple(out) if isinstance(out, (list, tuple)) else out

    p = pipe()
    p.build()
    got = []
    for _ in range(p.reader_meta("r")["epoch_size"]):
        outs = p.run()
        label = int(np.array(outs[1][0]).item()) if len(outs) > 1 else None
        got.append((outs[0][0].source_info(), np.array(outs[0][0]), label))
    return got


def same_file(root: Path, dali_path: str, map_path: str) -> bool:
    """Whether DALI's path (as it opens it, relative to root or absolute)
    and the map's clean relative path name the same file."""
    a = os.stat(os.path.join(root, dali_path))
    b = os.stat(root / map_path)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def test_file_list(tmp_path: Path) -> None:
    root = tmp_path / "enc"
    rng = np.random.default_rng(3)
    names = ["a.jpg", "b.jpg", "s/c.jpg", "s/t/d.jpg", "x y.jpg", " lead.jpg", "#hash.jpg"]
    for n in names:
        (root / n).parent.mkdir(parents=True, exist_ok=True)
        (root / n).write_bytes(rng.integers(0, 255, 100 + len(n) * 37, dtype=np.uint8).tobytes())
    lines = ["b.jpg 3", "", "a.jpg\t0", "s/c.jpg 12  ", "s/t/d.jpg 0007", "x y.jpg 2", " lead.jpg 1",
             "#hash.jpg 5", "./a.jpg 4", "s/../b.jpg 9", f"{root}/s/c.jpg 8", "b.jpg 3\r", "a.jpg 2147483647"]
    lst = root / "list.txt"
    lst.write_text("\n".join(lines))
    m = mkbmap("--file-list", str(lst), "--mountpoint", str(root), "-o", str(tmp_path / "enc.bmap"))
    dali = run_reader(fn.readers.file, file_root=str(root), file_list=str(lst))
    assert m["reader"] == "file" and m["listed"] and m["classes"] == []
    assert len(m["samples"]) == len(dali) == len([ln for ln in lines if ln.strip()])
    for s, (path, data, label) in zip(m["samples"], dali):
        assert s["label"] == label, (s["path"], path)
        assert same_file(root, path, s["path"]), (s["path"], path)
        assert (root / s["path"]).read_bytes() == data.tobytes()


def test_files_and_labels(tmp_path: Path) -> None:
    root = tmp_path / "enc"
    files = ["z.jpg", "a/b.jpg", "z.jpg", "m.png"]
    for i, f in enumerate(files):
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_bytes(f"file {f}".encode() * (i + 1))
    for labels in (None, [5, -3, 0, 2**31 - 1]):
        args = ["--mountpoint", str(root), "-o", str(tmp_path / "f.bmap"), *files]
        kw: dict[str, Any] = {"file_root": str(root), "files": files}
        if labels is not None:
            args += ["--labels", ",".join(map(str, labels))]
            kw["labels"] = labels
        m = mkbmap(*args)
        dali = run_reader(fn.readers.file, **kw)
        assert [(s["path"], s["label"]) for s in m["samples"]] == [(p, lbl) for p, _, lbl in dali]


def _npy_dataset(root: Path) -> None:
    """One dtype and rank (2-d float32), shapes of all sorts, as mkbmap
    takes a dataset; the other kinds of arrays are _KINDS."""
    rng = np.random.default_rng(11)
    arrays = {
        "b.npy": rng.standard_normal((3, 4)).astype(np.float32),
        "a.npy": rng.standard_normal((3, 4)).astype(np.float32),
        "_tiny.npy": np.array([[7]], dtype=np.float32),
        "empty.npy": np.zeros((0, 5), dtype=np.float32),
        "s1/x.npy": rng.standard_normal((2, 12)).astype(np.float32),
        "s1/row.npy": rng.standard_normal((1, 33)).astype(np.float32),
        "S0/col.npy": rng.standard_normal((5, 1)).astype(np.float32),
        "S0/big.npy": rng.standard_normal((64, 1000)).astype(np.float32),
        "S0/fortran_row.npy": np.asfortranarray(np.arange(4, dtype=np.float32).reshape(1, 4)),
        "s1/deep/ignored.npy": np.zeros((1, 3), dtype=np.float32),  # fn.readers.numpy looks no deeper
    }
    for name, a in arrays.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        np.save(root / name, a)
    (root / "notes.txt").write_text("not an array")
    (root / "s1" / "raw.arr").write_bytes((root / "a.npy").read_bytes())


_KINDS = {
    "scalar.npy": np.array(7, dtype=np.int64),
    "empty.npy": np.zeros((0, 5), dtype=np.uint16),
    "u8.npy": np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
    "bool.npy": np.arange(33) % 3 == 0,
    "half.npy": np.linspace(-2, 2, 17).astype(np.float16),
    "i8.npy": np.arange(-2, 3, dtype=np.int8).reshape(5, 1),
    "u64.npy": np.arange(6, dtype=np.uint64) * (2**62),
    "f8.npy": np.linspace(0, 1, 6).reshape(1, 2, 1, 3),
    "fortran_row.npy": np.asfortranarray(np.arange(4, dtype=np.int32).reshape(1, 4)),
}


def check_numpy(root: Path, m: dict[str, Any], dali: list) -> None:
    assert m["reader"] == "numpy" and m["classes"] == []
    assert len(m["samples"]) == len(dali)
    for s, (path, arr, _) in zip(m["samples"], dali):
        assert same_file(root, path, s["path"]), (s["path"], path)
        assert s["label"] == 0
        assert s["dtype"] == arr.dtype.name, s["path"]
        assert tuple(s.get("shape", [])) == arr.shape, s["path"]
        data = (root / s["path"]).read_bytes()
        assert len(data) == s["offset"] + s["size"]
        assert data[s["offset"]:] == arr.tobytes(), s["path"]
        assert np.load(root / s["path"]).tobytes() == arr.tobytes()


def test_numpy_discovery(tmp_path: Path) -> None:
    root = tmp_path / "vol"
    _npy_dataset(root)
    for flt in (None, "*.arr", "[!ab]*.npy"):
        args = ["--reader", "numpy", "--mountpoint", str(root), "-o", str(tmp_path / "v.bmap")]
        kw: dict[str, Any] = {"file_root": str(root)}
        if flt:
            args += ["--file-filter", flt]
            kw["file_filter"] = flt
        m = mkbmap(*args)
        dali = run_reader(fn.readers.numpy, **kw)
        check_numpy(root, m, dali)
        if flt is None:
            assert len(dali) == 9 and not any("deep" in s["path"] for s in m["samples"])


def test_numpy_kinds(tmp_path: Path) -> None:
    """Each kind of array (dtype, 0-d, empty, 4-d, Fortran order laid out
    as C), given as files (fn.readers.numpy's files=): one dataset each,
    since a dataset holds one dtype and rank."""
    root = tmp_path / "kinds"
    root.mkdir()
    for name, a in _KINDS.items():
        np.save(root / name, a)
    for name, a in _KINDS.items():
        m = mkbmap("--reader", "numpy", "--mountpoint", str(root), "-o", str(tmp_path / "k.bmap"), name, name)
        dali = run_reader(fn.readers.numpy, file_root=str(root), files=[name, name])
        check_numpy(root, m, dali)
        assert np.array_equal(dali[0][1], a) and dali[0][1].dtype == a.dtype and dali[0][1].shape == a.shape


def test_numpy_mixed_refused(tmp_path: Path) -> None:
    """mkbmap refuses a dataset of two dtypes, or two ranks, naming two
    files; DALI fails on a batch that holds both."""
    root = tmp_path / "mixed"
    root.mkdir()
    np.save(root / "a.npy", np.zeros((2, 3), np.float32))
    for other, a in (("b.npy", np.zeros((2, 3), np.float64)), ("c.npy", np.zeros(6, np.float32))):
        np.save(root / other, a)
        r = subprocess.run([str(BIN / "mkbmap"), "--reader", "numpy", "--mountpoint", str(root), "-o", str(tmp_path / "m.bmap")],
                           capture_output=True, text=True)
        assert r.returncode == 1 and "a.npy is float32 of shape (2, 3), 2-d" in r.stderr and other in r.stderr, r.stderr

        @pipeline_def(batch_size=2, num_threads=1, device_id=None)
        def pipe():
            return fn.readers.numpy(file_root=str(root))

        p = pipe()
        p.build()
        with pytest.raises(RuntimeError, match="Inconsistent data"):
            p.run()
        (root / other).unlink()


def test_numpy_file_list(tmp_path: Path) -> None:
    root = tmp_path / "vol"
    _npy_dataset(root)
    lst = tmp_path / "list.txt"
    lst.write_text("S0/big.npy\n\nb.npy\n./a.npy\ns1/deep/ignored.npy\nb.npy\n" + f"{root}/s1/raw.arr\n")
    m = mkbmap("--reader", "numpy", "--file-list", str(lst), "--mountpoint", str(root), "-o", str(tmp_path / "l.bmap"))
    check_numpy(root, m, run_reader(fn.readers.numpy, file_root=str(root), file_list=str(lst)))
