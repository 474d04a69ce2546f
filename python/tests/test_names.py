# SPDX-License-Identifier: Apache-2.0
"""One client, two import names: nvfeed, the package, and dali_source, the
module python/dali_source.py, DALI's external_source shim over it (first
class: no warning). Code written for either gets the same objects."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import dali_source
import nvfeed


def test_same_objects_under_both_names() -> None:
    assert dali_source.__version__ == nvfeed.__version__
    assert dali_source.__all__ == nvfeed.__all__
    for name in nvfeed.__all__:
        assert getattr(dali_source, name) is getattr(nvfeed, name), name
    from dali_source import LoaderSource, LoaderError, backends
    assert (LoaderSource, LoaderError, backends) == (nvfeed.LoaderSource, nvfeed.LoaderError, nvfeed.backends)


def test_a_module_at_python_dali_source_py_that_warns_of_nothing() -> None:
    """dali_source is the module python/dali_source.py (no package), and
    importing it, or its submodules, in a fresh interpreter with every
    warning an error, warns of nothing."""
    assert Path(dali_source.__file__).name == "dali_source.py"
    assert Path(dali_source.__file__).parent == Path(nvfeed.__file__).parents[1]
    assert "__init__" not in dali_source.__file__
    code = ("import dali_source, dali_source.dali, dali_source._stream\n"
            "from dali_source import LoaderSource\n"
            "print(dali_source.__file__)\n")
    where = str(Path(nvfeed.__file__).parents[1])
    r = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, cwd="/",
                       env={"PYTHONPATH": where})
    assert r.returncode == 0 and not r.stderr, r.stderr
    assert r.stdout.strip() == str(Path(where) / "dali_source.py")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.reload(dali_source)
    doc = dali_source.__doc__ or ""
    assert "external_source" in doc and "former" not in doc and "deprecat" not in doc.lower(), doc[:200]


def test_submodules_are_nvfeeds_own() -> None:
    """dali_source.torch and dali_source.dali are nvfeed's modules, their
    own specs kept; a name nvfeed lacks is no module."""
    torch = importlib.import_module("dali_source.torch")
    import nvfeed.torch
    assert torch is nvfeed.torch and torch.__spec__ is not None and torch.__spec__.name == "nvfeed.torch"
    from dali_source.torch import LoaderDataset
    assert LoaderDataset is nvfeed.torch.LoaderDataset
    import dali_source.dali
    import nvfeed.dali
    assert dali_source.dali is nvfeed.dali and dali_source.dali.__spec__.name == "nvfeed.dali"
    try:
        importlib.import_module("dali_source.no_such_module")
    except ModuleNotFoundError:
        pass
    else:
        raise AssertionError("dali_source.no_such_module imported")


def test_names_beyond_all() -> None:
    """What the package offered beside __all__ (the batch types, the other
    exceptions, the messages) is there under both names."""
    public = [n for n in vars(nvfeed) if not n.startswith("_") and not isinstance(getattr(nvfeed, n), type(sys))]
    for name in ("Sample", "Batch", "DaliBatch", "CudaError", "StreamError", "UpgradeError", "BackendsResponse",
                 "MemoryDesc", "OnError", "Transport", "Device", "GPUPath", "BatchFormat"):
        assert name in public, name
    for name in public:
        assert getattr(dali_source, name) is getattr(nvfeed, name), name
    try:
        dali_source.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "dali_source" in str(e) and "no_such_name" in str(e)
    else:
        raise AssertionError("dali_source.no_such_name did not raise AttributeError")


def test_star_import() -> None:
    a: dict[str, object] = {}
    b: dict[str, object] = {}
    exec("from nvfeed import *", a)
    exec("from dali_source import *", b)
    a.pop("__builtins__")
    b.pop("__builtins__")
    assert a == b and set(a) == set(nvfeed.__all__)


def test_module_names_under_dali_source() -> None:
    """The client's modules under dali_source's dotted names are the same
    module objects (no second copy of a class)."""
    for mod in ("_api", "_connect", "_cuda", "_errors", "_http", "_memory", "_source", "_stream", "_upgrade", "_wire"):
        assert importlib.import_module(f"dali_source.{mod}") is importlib.import_module(f"nvfeed.{mod}"), mod
    from dali_source._stream import Stream
    from nvfeed._stream import Stream as S
    assert Stream is S


def test_dali_source_alone_in_a_fresh_interpreter() -> None:
    """Importing only dali_source, first thing, works."""
    code = ("from dali_source._memory import receive\n"
            "import dali_source, sys\n"
            "from dali_source import LoaderSource\n"
            "assert LoaderSource is sys.modules['nvfeed'].LoaderSource\n"
            "assert receive is sys.modules['nvfeed._memory'].receive\n"
            "print(dali_source.__version__)\n")
    # The client this process imports (the installed one under make test).
    where = str(Path(nvfeed.__file__).parents[1])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", env={"PYTHONPATH": where})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == nvfeed.__version__


MAX_MODULE_LINES = 300
"""Every module of the client stays under this many lines: one that
reaches it does more than one job and is split along them."""


def test_every_client_module_is_small() -> None:
    root = Path(nvfeed.__file__).parent
    modules = sorted(root.glob("*.py")) + [Path(dali_source.__file__)]
    assert len(modules) > 10, root
    big = {f"{m.parent.name}/{m.name}": n for m in modules
           if (n := len(m.read_text(encoding="utf-8").splitlines())) >= MAX_MODULE_LINES}
    assert not big, f"client modules of {MAX_MODULE_LINES} lines or more (split them along their jobs): {big}"
