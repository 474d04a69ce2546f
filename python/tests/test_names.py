# SPDX-License-Identifier: Apache-2.0
"""One client, two import names: nvfeed, the package, and dali_source, the
module python/dali_source.py, DALI's external_source shim over it (first
class: no warning). Code written for either gets the same objects. And
the client's shape: objects own their parts, and imports stay shallow."""

from __future__ import annotations

import ast
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


def _classes() -> dict[str, tuple[str, ast.ClassDef]]:
    """Every class of the client by name (a name two modules define, by
    module and name): its module and its definition."""
    root = Path(nvfeed.__file__).parent
    found = [(m.name, node) for m in sorted(root.glob("*.py"))
             for node in ast.walk(ast.parse(m.read_text(encoding="utf-8"))) if isinstance(node, ast.ClassDef)]
    twice = {n.name for _, n in found if sum(o.name == n.name for _, o in found) > 1}
    return {f"{mod}.{n.name}" if n.name in twice else n.name: (mod, n) for mod, n in found}


KINDS = {"BaseException", "Exception", "TypedDict", "Protocol", "NamedTuple", "Enum", "IntEnum"}
"""What a class may inherit from another client class as: an exception,
a TypedDict, a Protocol, a NamedTuple or an Enum. Each is a type, not an
object with parts."""


def _base(b: ast.expr) -> str:
    """A base class's name, without module or subscript."""
    if isinstance(b, ast.Subscript):
        b = b.value
    return b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""


def _sets(cls: ast.ClassDef) -> set[str]:
    """The names a class sets: its class body's, and each ``self.x`` its
    methods assign."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            names.update(e.id for t in node.targets if isinstance(t, ast.Tuple) for e in t.elts
                         if isinstance(e, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    for node in ast.walk(cls):
        targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                   if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        for t in targets:
            for a in ast.walk(t):
                if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name) and a.value.id == "self":
                    names.add(a.attr)
    return names


def test_no_class_inherits_its_parts() -> None:
    """An object owns its parts: no client class inherits from another
    client class, but as an exception, a TypedDict, a Protocol, a
    NamedTuple or an Enum (``KINDS``), or where neither sets state (a
    tensor subclass). So no part leans on another's private state."""
    classes = _classes()

    def of_a_kind(name: str) -> bool:
        if name in KINDS or name.endswith(("Error", "Warning")) and name not in classes:
            return True
        return name in classes and any(of_a_kind(_base(b)) for b in classes[name][1].bases)

    def stateful(name: str) -> bool:
        return any(isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
                   and n.value.id == "self" for n in ast.walk(classes[name][1]))

    bad = [f"{mod}: {name}({_base(b)})" for name, (mod, node) in classes.items() for b in node.bases
           if _base(b) in classes and not of_a_kind(name) and (stateful(name) or stateful(_base(b)))]
    assert not bad, f"client classes that inherit their parts (own them instead): {bad}"


def test_each_class_sets_the_private_attributes_it_reads() -> None:
    """No method reads a ``self._x`` its class (or a client base of a kind
    it may inherit) never sets: a private attribute belongs to the object
    that sets it."""
    classes = _classes()
    bad = []
    for name, (mod, node) in classes.items():
        own = _sets(node)
        for b in node.bases:
            if _base(b) in classes:
                own |= _sets(classes[_base(b)][1])
        for a in ast.walk(node):
            if (isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name) and a.value.id == "self"
                    and a.attr.startswith("_") and not a.attr.startswith("__") and a.attr not in own):
                bad.append(f"{mod}:{a.lineno}: {name} reads self.{a.attr}")
    assert not bad, f"private attributes read but never set by their class: {bad}"


def import_depth(root: Path) -> tuple[int, list[str]]:
    """The longest chain of module-level imports inside the package at
    ``root``, and that chain."""
    graph: dict[str, set[str]] = {}
    for m in root.glob("*.py"):
        deps: set[str] = set()
        for node in ast.parse(m.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        graph[m.stem] = {d for d in deps if (root / f"{d}.py").exists()}
    memo: dict[str, list[str]] = {}

    def chain(m: str) -> list[str]:
        if m not in memo:
            memo[m] = []  # a cycle counts once
            memo[m] = [m] + max((chain(d) for d in sorted(graph[m])), key=len, default=[])
        return memo[m]

    longest = max((chain(m) for m in sorted(graph)), key=len)
    return len(longest), longest


MAX_IMPORT_DEPTH = 10
"""The most floors of imports inside the client (nvfeed.dali's chain down
to ``_errors``). It was 14 when the source was five inheriting classes."""


def test_imports_are_shallow() -> None:
    depth, chain = import_depth(Path(nvfeed.__file__).parent)
    assert depth <= MAX_IMPORT_DEPTH, f"{depth} floors of imports: {' -> '.join(chain)}"
