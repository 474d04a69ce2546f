# SPDX-License-Identifier: Apache-2.0
"""Writes dali.json: what real DALI makes of file lists and .npy trees, for
package bmap's tests (ParseFileList, ParseNumpyFileList, DiscoverNumpy).

"numpy_files" are .npy files of every kind (np.save's, and headers
written by hand), each case read by fn.readers.numpy as one batch: the
dtype, shape and bytes DALI returns for each, or its error ("mixed" when
the batch mixes dtypes or numbers of dimensions).

Each other case gives a tree of files (a name ending in "/" is a directory,
"a -> b" a symlink), and either a file list's text (fn.readers.file or
fn.readers.numpy with file_list=) or a file_filter (fn.readers.numpy
discovering under file_root); DALI's answer is the samples it returns in
order (source_info, and the label for fn.readers.file) over one epoch, or
the error it raises: "list" when DALI refuses the list itself, "empty"
when it finds no file, "read" when it parsed the list and then failed on
a file.

Run with DALI installed (CPU is enough), from this directory:

    ../../../.venv/bin/python gen_dali.py > dali.json
"""

from __future__ import annotations

import base64
import io
import json
import os
import struct
import sys
import tempfile

import numpy as np
from nvidia.dali import __version__ as dali_version
from nvidia.dali import fn, pipeline_def

LONG = "l" * 16381  # with " 1": a 16383-byte line, DALI's longest

FILE_LISTS = {
    "mixed": (["a.jpg", "b.jpg", "s/c.jpg", "x y.jpg", " lead.jpg", "t\tab.jpg", "#c.jpg", "a.jpg 3", "n.txt"],
              "b.jpg 1\na.jpg 0\n\n   \t\ns/c.jpg\t7  \nx y.jpg 2\n lead.jpg 4\nt\tab.jpg 5\n#c.jpg 6\n"
              "a.jpg 3 9\nb.jpg 1\r\nn.txt 0012\na.jpg 1\f\v\na.jpg 1"),
    "duplicates in order": (["a.jpg", "b.jpg"], "b.jpg 5\na.jpg 5\nb.jpg 5\n"),
    "dot segments": (["s/c.jpg", "a.jpg"], "./a.jpg 0\ns/../a.jpg 1\ns/./c.jpg 2\n"),
    "longest line": ([], LONG + " 1\n"),  # parsed, then no such file
    "line too long": ([], "m" * 16382 + " 1\n"),
    "negative label": (["a.jpg"], "a.jpg -1\n"),
    "no label": (["a.jpg"], "a.jpg\n"),
    "plus sign": (["a.jpg"], "a.jpg +3\n"),
    "label and junk": (["a.jpg"], "a.jpg 3x\n"),
    "label only": ([], "3\n"),
    "space then label": ([], " 3\n"),
    "no space": (["a.jpg3"], "a.jpg3\n"),
    "comment": (["a.jpg"], "# a comment\na.jpg 1\n"),
    "empty": ([], "\n \n"),
}

NUMPY_LISTS = {
    "verbatim": (["a.npy", "b.npy", "s/c.npy", "x y.npy", " lead.npy", "trail.npy ", "cr.npy\r", "#c.npy", "a.npy 3", "n.txt"],
                 "b.npy\n\na.npy\ns/c.npy\nx y.npy\n lead.npy\ntrail.npy \ncr.npy\r\n#c.npy\na.npy 3\n./a.npy\n"
                 "s/../b.npy\nn.txt\nb.npy"),
    "blank line is a path": (["a.npy"], "a.npy\n  \n"),
    "longest line": (["n" * 255], "n" * 255 + "\n"),
    "line too long": ([], "m" * 16384 + "\n"),
}

NUMPY_TREES = {
    "discovery": ([
        "b.npy", "a.npy", "A.NPY", "B.Npy", "c.txt", "a b.npy", "_u.npy", "~t.npy", ".h.npy",
        "sub1/z.npy", "sub1/a.npy", "sub1/deep/d.npy", "Sub0/y.npy", ".hid/h.npy", "-x/m.npy",
        "target/t.npy", "dir.npy/in.npy", "zlink.npy -> a.npy", "dlink -> target", "empty/",
    ], ["*.npy", "*.NPY", "[!ab_.]*.npy", "[^a-s]*", "?.npy"]),
}


def save(a: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    f = io.BytesIO()
    if version is None:
        np.save(f, a, allow_pickle=True)
    else:
        np.lib.format.write_array(f, a, version=version)
    return f.getvalue()


def by_hand(header: str, data: bytes, align: int = 64) -> bytes:
    """A version 1.0 file with this header dict, padded with spaces (and a
    newline) so the data starts at a multiple of align (0: no padding)."""
    if align:
        header += " " * (-(10 + len(header) + 1) % align)
    header += "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data


I4 = np.arange(6, dtype="<i4").tobytes()
D = "{'descr': '<i4', 'fortran_order': False, 'shape': (6,), }"
NUMPY_FILES: dict[str, dict[str, bytes]] = {
    **{f"dtype {t}": {"a.npy": save((np.arange(6) % 2 == 1 if t == "b1" else np.arange(6)).astype(t).reshape(2, 3))}
       for t in ("u1", "u2", "u4", "u8", "i1", "i2", "i4", "i8", "f2", "f4", "f8", "b1")},
    "0-d arrays": {"a.npy": save(np.array(5, dtype="<i8")), "b.npy": save(np.array(-7, dtype="<i8"))},
    "empty arrays": {"a.npy": save(np.zeros((0, 5), "<u2")), "b.npy": save(np.ones((2, 5), "<u2"))},
    "4-d": {"a.npy": save(np.arange(24, dtype="<f4").reshape(1, 2, 3, 4))},
    "ragged, one rank": {"a.npy": save(np.arange(3, dtype="<i4")), "b.npy": save(np.arange(5, dtype="<i4"))},
    "mixed dtypes": {"a.npy": save(np.arange(3, dtype="<i4")), "b.npy": save(np.arange(3, dtype="<f4"))},
    "mixed ranks": {"a.npy": save(np.arange(3, dtype="<i4")), "b.npy": save(np.arange(6, dtype="<i4").reshape(2, 3))},
    "0-d and 1-d": {"a.npy": save(np.array(3, dtype="<i4")), "b.npy": save(np.arange(1, dtype="<i4"))},
    "fortran order": {"a.npy": save(np.asfortranarray(np.arange(6, dtype="<i4").reshape(2, 3)))},
    "fortran order, one row": {"a.npy": save(np.asfortranarray(np.arange(4, dtype="<i4").reshape(1, 4)))},
    "fortran_order True, 1-d": {"a.npy": by_hand("{'descr': '<i4', 'fortran_order': True, 'shape': (6,), }", I4)},
    "big-endian": {"a.npy": save(np.arange(3, dtype=">i4"))},
    "big-endian one byte": {"a.npy": by_hand("{'descr': '>u1', 'fortran_order': False, 'shape': (3,), }", b"abc")},
    "version 2.0": {"a.npy": save(np.arange(3, dtype="<i4"), (2, 0))},
    "version 3.0": {"a.npy": save(np.arange(3, dtype="<i4"), (3, 0))},
    "complex64": {"a.npy": save(np.arange(3, dtype="<c8"))},
    "object": {"a.npy": save(np.array([1, "x"], dtype=object))},
    "structured": {"a.npy": save(np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")]))},
    "unicode": {"a.npy": save(np.array(["ab", "c"]))},
    "header aligned to 16": {"a.npy": by_hand(D, I4, 16)},
    "header aligned to 4096": {"a.npy": by_hand(D, I4, 4096)},
    "header not aligned to 16": {"a.npy": by_hand(D, I4, 0)},
    "keys in another order": {"a.npy": by_hand("{'shape': (6,), 'fortran_order': False, 'descr': '<i4', }", I4)},
    "double quotes": {"a.npy": by_hand('{"descr": "<i4", "fortran_order": False, "shape": (6,), }', I4)},
    "no trailing comma": {"a.npy": by_hand("{'descr':'<i4','fortran_order':False,'shape':(6,)}", I4)},
    "descr =i4": {"a.npy": by_hand("{'descr': '=i4', 'fortran_order': False, 'shape': (6,), }", I4)},
    "descr |i4": {"a.npy": by_hand("{'descr': '|i4', 'fortran_order': False, 'shape': (6,), }", I4)},
    "bytes after the data": {"a.npy": save(np.arange(6, dtype="<i4")) + b"tail"},
    "data truncated": {"a.npy": save(np.arange(6, dtype="<i4"))[:-4]},
}


def read_files(files: dict[str, bytes]) -> dict:
    """fn.readers.numpy over files, all in one batch."""
    with tempfile.TemporaryDirectory() as root:
        for name, b in files.items():
            with open(os.path.join(root, name), "wb") as f:
                f.write(b)

        @pipeline_def(batch_size=len(files), num_threads=1, device_id=None)
        def pipe():
            return fn.readers.numpy(file_root=root, name="r")

        try:
            p = pipe()
            p.build()
            (out,) = p.run()
        except RuntimeError as e:
            msg = str(e)
            lines = [ln for ln in msg.splitlines() if "Assert on" in ln or "Unknown" in ln or "Error" in ln]
            kind = "mixed" if "Inconsistent data" in msg else "read"
            return {"error": (lines[-1] if lines else msg.splitlines()[0]).strip()[:300].replace(root, "ROOT"), "error_kind": kind}
        got = []
        for i in range(len(out)):
            a = np.array(out[i])
            got.append({"path": out[i].source_info(), "dtype": a.dtype.str, "shape": list(a.shape),
                        "data": base64.b64encode(a.tobytes()).decode()})
        return {"samples": got}


def make_tree(root: str, tree: list[str]) -> None:
    for i, p in enumerate(tree):
        full = os.path.join(root, p)
        if " -> " in p:
            src, dst = p.split(" -> ")
            os.symlink(dst, os.path.join(root, src))
        elif p.endswith("/"):
            os.makedirs(full, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as f:
                np.save(f, np.array([i], dtype=np.int32))


def run(reader, **kw):
    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():
        out = reader(**kw, name="r")
        return tuple(out) if isinstance(out, (list, tuple)) else out

    try:
        p = pipe()
        p.build()
        n = p.reader_meta("r")["epoch_size"]
        got = []
        for _ in range(n):
            outs = p.run()
            sample = {"path": outs[0][0].source_info()}
            if len(outs) > 1:
                sample["label"] = int(np.array(outs[1][0]).item())
            got.append(sample)
        return {"samples": got}
    except RuntimeError as e:
        msg = str(e)
        kind = "list" if "Incorrect format" in msg or "Wrong format" in msg else "empty" if "No files found" in msg else "read"
        lines = [ln for ln in msg.splitlines() if "Assert on" in ln or "failed" in ln]
        return {"error": (lines[0] if lines else msg.splitlines()[0])[:200], "error_kind": kind}


def main() -> None:
    out = {"dali": dali_version, "file_lists": [], "numpy_lists": [], "numpy_trees": [], "numpy_files": []}
    for kind, cases, reader in (("file_lists", FILE_LISTS, fn.readers.file),
                                ("numpy_lists", NUMPY_LISTS, fn.readers.numpy)):
        for name, (tree, text) in cases.items():
            with tempfile.TemporaryDirectory() as root:
                make_tree(root, tree)
                lst = os.path.join(root, "list.txt")
                with open(lst, "w", newline="") as f:
                    f.write(text)
                res = run(reader, file_root=root, file_list=lst)
            out[kind].append({"name": name, "tree": tree, "list": text, **res})
    for name, (tree, filters) in NUMPY_TREES.items():
        for flt in filters:
            with tempfile.TemporaryDirectory() as root:
                make_tree(root, tree)
                res = run(fn.readers.numpy, file_root=root, file_filter=flt)
            out["numpy_trees"].append({"name": name, "tree": tree, "filter": flt, **res})
    for name, files in NUMPY_FILES.items():
        out["numpy_files"].append({"name": name, "files": {k: base64.b64encode(v).decode() for k, v in files.items()},
                                   **read_files(files)})
    json.dump(out, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
