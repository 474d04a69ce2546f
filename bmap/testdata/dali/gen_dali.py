# SPDX-License-Identifier: Apache-2.0
"""Writes dali.json: what real DALI makes of file lists and .npy trees, for
package bmap's tests (ParseFileList, ParseNumpyFileList, DiscoverNumpy).

Each case gives a tree of files (a name ending in "/" is a directory,
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

import json
import os
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
    out = {"dali": dali_version, "file_lists": [], "numpy_lists": [], "numpy_trees": []}
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
    json.dump(out, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
