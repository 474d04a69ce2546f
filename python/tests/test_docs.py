# SPDX-License-Identifier: Apache-2.0
"""The documents' Python examples against the real client.

Each ``python`` code block of the READMEs and of ``docs/`` must parse. Each
name it imports from ``nvfeed`` must exist. Each call of the client's
entry points must pass only keywords that the entry point takes.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest

import nvfeed
import nvfeed.dali
import nvfeed.torch

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "python" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^( *)```python\n(.*?)^ *```", re.M | re.S)

# The entry points as the examples write them, and the callable whose
# keywords each takes. PairedSource and the ops reader pass the rest on.
ENTRY: dict[str, Callable[..., Any]] = {
    "LoaderSource": nvfeed.LoaderSource,
    "PairedSource": nvfeed.LoaderSource,
    "LoaderDataset": nvfeed.torch.LoaderDataset,
    "nvfeed.dali.reader": nvfeed.dali.reader,
    "nvfeed.dali.ops.readers.Numpy": nvfeed.dali.reader,
    "backends": nvfeed.backends,
    "datasets": nvfeed.datasets,
}
# Keywords that PairedSource and the ops reader take besides those.
OWN = {"PairedSource": {"datasets", "state"}, "nvfeed.dali.ops.readers.Numpy": {"files"}}


def blocks() -> list[tuple[str, str]]:
    """Every python block of the documents, with where it starts."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append((f"{doc.relative_to(ROOT)}:{line}", textwrap.dedent(m.group(2))))
    return out


def dotted(node: ast.expr) -> str:
    """A call's function as written: ``a.b.c``, or "" for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def test_documents_have_python_examples() -> None:
    assert len(blocks()) >= 10


@pytest.mark.parametrize("where,code", blocks(), ids=[w for w, _ in blocks()])
def test_example_matches_the_api(where: str, code: str) -> None:
    tree = ast.parse(code, filename=where)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "nvfeed":
            module = __import__(node.module, fromlist=["_"])
            for alias in node.names:
                assert hasattr(module, alias.name), f"{where}: {node.module} has no {alias.name}"
        if not isinstance(node, ast.Call):
            continue
        name = dotted(node.func)
        fn = ENTRY.get(name)
        if fn is None:
            continue
        params = inspect.signature(fn).parameters
        for kw in node.keywords:
            if kw.arg is None:
                continue
            assert kw.arg in params or kw.arg in OWN.get(name, set()), f"{where}: {name} takes no {kw.arg}="


def test_dali_source_modules_are_nvfeeds() -> None:
    # python/README.md: importing dali_source.dali and dali_source.torch
    # gives nvfeed's modules themselves.
    import dali_source.dali
    import dali_source.torch

    assert dali_source.dali is nvfeed.dali
    assert dali_source.torch is nvfeed.torch
