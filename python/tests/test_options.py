# SPDX-License-Identifier: Apache-2.0
"""A source's arguments as one checked structure (SourceOptions: built and
validated once, frozen), and the deprecated names: the legacy
re-exports of nvfeed, which still work and warn; the dali_source module,
DALI's entry point, warns of nothing. (The bounds' ties to the daemon's Go constants are checked by the
Go test TestPythonBoundsAreTheDaemons.)"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import nvfeed
from nvfeed import SourceOptions


def test_options_checked_once_and_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVFEED_SOCKET", "/tmp/nvfeed-options.sock")
    o = SourceOptions.check("train", batch_size=8, shard_id=1, num_shards=2, seed=2**64 - 1, job_id="j",
                            prefetch_queue_depth=3, backend="file")
    assert o.socket == "/tmp/nvfeed-options.sock" and o.reader_args["shard_id"] == 1 and o.fingerprint == ""
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.batch_format = "dali"  # type: ignore[misc]
    req = o.open_request()
    assert req["dataset"] == "train" and req["batch_size"] == 8 and req["seed"] == 2**64 - 1
    assert req["job_id"] == "j" and req["prefetch_queue_depth"] == 3 and req["backend"] == "file"
    assert req["memory"] == "pinned" and "gpu_path" not in req and "fingerprint" not in req
    assert o == SourceOptions.check("train", batch_size=8, shard_id=1, num_shards=2, seed=2**64 - 1, job_id="j",
                                    prefetch_queue_depth=3, backend="file")


@pytest.mark.parametrize("kw, msg", [
    ({"batch_size": 0}, r"batch_size must be an int in \[1, 65536\], got 0"),
    ({"shard_id": 2, "num_shards": 2}, r"shard_id must be an int in \[0, 1\] \(num_shards is 2\), got 2"),
    ({"prefetch_queue_depth": 65}, r"prefetch_queue_depth must be an int in \[1, 64\] or None"),
    ({"release_after": 65}, r"release_after must be an int in \[0, 64\] or None"),
    ({"device_id": 1024}, r"device_id must be an int in \[0, 1023\], got 1024"),
    ({"initial_fill": 2**24 + 1}, r"initial_fill must be an int in \[1, 16777216\]"),
    ({"job_id": "j" * 129}, "job_id must be a str of at most 128 bytes"),
    ({"gpu_path": "dma"}, "gpu_path must be 'auto', 'cufile' or 'bounce', got 'dma'"),
    ({"on_error": "ignore"}, "on_error must be 'raise' or 'skip', got 'ignore'"),
    ({"timeout": 0}, "timeout"),
    ({"cuda_stream": 5}, "cuda_stream is for device='gpu'"),
])
def test_options_out_of_range(kw: dict[str, object], msg: str) -> None:
    """Each argument out of its range or choices: a ValueError naming it,
    its range and the value, before any daemon is asked (no socket here)."""
    with pytest.raises(ValueError, match=msg):
        SourceOptions.check("train", socket="/nonexistent/loaderd.sock", **kw)  # type: ignore[arg-type]


def test_legacy_reexports_warn_and_work() -> None:
    """The helpers and messages once re-exported from nvfeed still come,
    the same objects, with a DeprecationWarning naming where they live;
    the API's names do not warn."""
    from nvfeed import _connect, _memory, _stream, _wire
    for name, mod in [("connect", _connect), ("socket_path", _connect), ("receive", _memory), ("Stream", _stream),
                      ("OpenRequest", _wire), ("NextResponse", _wire)]:
        with pytest.warns(DeprecationWarning, match=f"nvfeed.{name} is not part of the client's API"):
            assert getattr(nvfeed, name) is getattr(mod, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from nvfeed import Batch, CudaError, LoaderSource, MemoryDesc, State  # noqa: F401
    with pytest.raises(AttributeError, match="no_such_name"):
        nvfeed.no_such_name  # type: ignore[attr-defined]  # noqa: B018


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    """code run by a fresh interpreter importing this client, warnings shown."""
    where = str(Path(nvfeed.__file__).parents[1])
    return subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-c", code], capture_output=True,
                          text=True, cwd="/", env={"PYTHONPATH": where})


def test_dali_source_import_works_and_warns_of_nothing() -> None:
    """Importing dali_source (python/dali_source.py, DALI's entry point)
    gives nvfeed's objects and warns of nothing; nor does nvfeed."""
    r = _fresh("import dali_source\nimport dali_source._stream\nfrom dali_source import LoaderSource\n"
               "import nvfeed\nassert LoaderSource is nvfeed.LoaderSource\n")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = _fresh("import nvfeed\nfrom nvfeed import LoaderSource, SourceOptions, Batch, CudaError\n")
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_one_declaration_writes_the_signature_and_the_docs() -> None:
    """Each argument is declared once, as a field of SourceOptions: that
    field gives LoaderSource's signature its name and default, and its
    docstring the argument's entry; LoaderDataset and nvfeed.dali.reader
    take the same defaults."""
    import inspect

    from nvfeed._options import _PARAMS

    sig = inspect.signature(nvfeed.LoaderSource).parameters
    assert list(sig) == [*_PARAMS, "dali_args"]
    doc = inspect.getdoc(nvfeed.LoaderSource) or ""
    for name, f in _PARAMS.items():
        assert sig[name].default is (inspect.Parameter.empty if name == "dataset" else f.default), name
        head = next(line for line in doc.splitlines() if line.startswith(f"{name} : "))
        if f.default is not None and name != "dataset":
            assert head.endswith(f"default = {f.default!r}".replace("'", '"')), head
        assert f.metadata["doc"].splitlines()[0].strip() in doc, name
    import re

    from nvfeed.dali import reader
    from nvfeed.torch import LoaderDataset
    for name, p in inspect.signature(LoaderDataset).parameters.items():
        if name in _PARAMS and name not in ("dataset", "shard_id", "num_shards", "case_sensitive_extensions"):
            assert p.default == _PARAMS[name].default, name
    for obj in (nvfeed.LoaderSource, LoaderDataset, reader):
        filled = inspect.getdoc(obj) or ""
        assert "stick_to_shard : bool, optional, default = False" in filled, obj
        assert not re.search(r"^ *\{\w+\}$", filled, re.MULTILINE), obj


def test_the_signature_type_checkers_see_is_the_declared_one() -> None:
    """LoaderSource's __init__ for type checkers names each declared
    argument, in order, with its declared type, and no default of its own."""
    import ast
    import inspect

    import nvfeed._source
    from nvfeed._options import _PARAMS

    tree = ast.parse(inspect.getsource(nvfeed._source))
    stub = next(n for n in ast.walk(tree) if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
                and any(isinstance(b, ast.FunctionDef) and b.name == "__init__" for b in n.body))
    init = next(b for b in stub.body if isinstance(b, ast.FunctionDef))
    args = init.args.args[1:]
    assert [a.arg for a in args] == list(_PARAMS)
    for a in args:
        f = _PARAMS[a.arg]
        assert ast.unparse(a.annotation) == (f.metadata["accepts"] or f.type), a.arg  # type: ignore[arg-type]
    assert all(isinstance(d, ast.Constant) and d.value is Ellipsis for d in init.args.defaults)
