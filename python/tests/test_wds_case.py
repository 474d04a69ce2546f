# SPDX-License-Identifier: Apache-2.0
"""WebDataset components matched as the library being replaced matches
them, on real shards whose extensions are not all lower-case: ImageNet's
``n01440764_10026.JPEG`` with its ``.cls``, made by GNU ``tar``, and by
``webdataset.TarWriter``; mixed case (``.jpg``, ``.JPEG``, ``.Jpeg``,
``.CLS``), some samples without a label.

``nvfeed.torch.LoaderDataset`` yields, sample by sample, what
``webdataset.WebDataset(...).to_tuple(...)`` yields (which lower-cases
every member's extension); ``missing_component_behavior="skip"`` says once
an epoch how many samples it left out and why. ``nvfeed.dali.reader``
yields what ``fn.readers.webdataset`` does, case-sensitive by default as
DALI is. An ``ext`` entry that matches no member of the dataset (an
extension the tars lack, or one named with its dot) is refused when the
session opens, naming the extensions the tars have: DALI and the
``webdataset`` library would give empty outputs (or skip everything)."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import warnings
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import pytest

from conftest import BIN, Daemon, Dataset, start_daemon, stop_daemon

try:
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def
except Exception as e:  # noqa: BLE001 - any import failure means no DALI here
    pytest.skip(f"cannot import nvidia.dali: {e!r}", allow_module_level=True)

webdataset = pytest.importorskip("webdataset")

import nvfeed.dali  # noqa: E402 - after the skips
from nvfeed import BadRequestError  # noqa: E402
from nvfeed.torch import LoaderDataset  # noqa: E402

SHARDS, PER_SHARD = 2, 23


def _image(i: int) -> bytes:
    return bytes([i % 251]) * (40 + i % 17) + b"JFIF" + str(i).encode()


def _gnu_tar(root: Path, names: dict[str, bytes], shard: str) -> None:
    """A shard made by GNU tar, members in the order given."""
    stage = root.parent / (root.name + "-stage")
    stage.mkdir(exist_ok=True)
    for n, data in names.items():
        (stage / n).write_bytes(data)
    subprocess.run(["tar", "--format=gnu", "-cf", str(root / shard), "-C", str(stage), *names], check=True)


def _imagenet(root: Path) -> None:
    """ImageNet as GNU tar shards: every image ``.JPEG``, every label ``.cls``."""
    for s in range(SHARDS):
        names = {}
        for j in range(PER_SHARD):
            i = s * PER_SHARD + j
            names[f"n01440764_{10026 + i}.JPEG"] = _image(i)
            names[f"n01440764_{10026 + i}.cls"] = str(i % 5).encode()
        _gnu_tar(root, names, f"imagenet-{s:03d}.tar")


def _mixed(root: Path) -> None:
    """GNU tar shards of mixed case: images ``.jpg``, ``.JPEG``, ``.Jpeg``,
    ``.jpeg`` in turn; labels ``.cls`` or ``.CLS``, none every 7th."""
    for s in range(SHARDS):
        names = {}
        for j in range(PER_SHARD):
            i = s * PER_SHARD + j
            k = f"img{i:04d}"
            names[f"{k}.{('jpg', 'JPEG', 'Jpeg', 'jpeg')[i % 4]}"] = _image(i)
            if i % 7 != 6:
                names[f"{k}.{'CLS' if i % 3 == 0 else 'cls'}"] = str(i % 5).encode()
        _gnu_tar(root, names, f"mixed-{s:03d}.tar")


def _writer(root: Path) -> None:
    """Shards of ``webdataset.TarWriter``, its keys upper- and mixed-case."""
    for s in range(SHARDS):
        with webdataset.TarWriter(str(root / f"writer-{s:03d}.tar")) as sink:
            for j in range(PER_SHARD):
                i = s * PER_SHARD + j
                sample = {"__key__": f"w{i:04d}", ("JPEG" if i % 2 else "Jpg"): _image(i), "cls": str(i % 5)}
                if i % 5 == 4:
                    del sample["cls"]
                sink.write(sample)


KINDS = {"imagenet": _imagenet, "mixed": _mixed, "writer": _writer}


@pytest.fixture(scope="module")
def served(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, dict[str, list[str]]]]:
    """A daemon serving each kind of shards as a dataset of its name."""
    work = tmp_path_factory.mktemp("wdscase")
    args, paths = [], {}
    for name, make in KINDS.items():
        root = dataset.root.parent / f"wdscase-{name}"
        root.mkdir()
        make(root)
        os.sync()
        paths[name] = sorted(str(p) for p in root.glob("*.tar"))
        m = work / f"{name}.bmap"
        subprocess.run([str(BIN / "mkbmap"), "--reader", "webdataset", "--mountpoint", str(root), "-o", str(m)],
                       check=True, capture_output=True)
        args += ["--dataset", f"{name}={m}"]
    d = start_daemon(work, dataset.bmap, *args)
    yield d, paths
    assert stop_daemon(d) == 0, d.log.read_text()


def _library(paths: list[str], ext: list[str], missing: str) -> list[tuple[bytes, ...]]:
    """The webdataset library's samples: ``to_tuple(*ext)``; skip drops a
    sample lacking a component (its ValueError ignored), empty keeps it
    with ``b""`` for what it lacks."""
    ds = webdataset.WebDataset(paths, shardshuffle=False, empty_check=False)
    if missing == "skip":
        tuples = ds.to_tuple(*ext, handler=webdataset.ignore_and_continue)
    else:
        tuples = ds.to_tuple(*ext, missing_is_error=False)
    return [tuple(b"" if c is None else bytes(c) for c in t) for t in tuples]


def _dataset(d: Daemon, name: str, ext: list[str], missing: str, epochs: int = 1,
             **kw: Any) -> list[tuple[bytes, ...]]:
    """epochs epochs of LoaderDataset, each sample its components' bytes."""
    ds = LoaderDataset(name, socket=d.socket, batch_size=5, ext=ext, missing_component_behavior=missing, **kw)
    got: list[tuple[bytes, ...]] = []
    try:
        for _ in range(epochs):
            for batch in ds:
                got += list(zip(*batch))
    finally:
        ds.close()
    return got


CASES = [  # dataset, ext, missing_component_behavior
    ("imagenet", ["jpeg", "cls"], "empty"),
    ("imagenet", ["jpeg", "cls"], "skip"),
    ("mixed", ["jpeg", "cls"], "skip"),
    ("mixed", ["jpeg;jpg", "cls"], "skip"),
    ("mixed", ["jpg;JPEG", "cls"], "empty"),  # "JPEG" matches nothing in webdataset: left out
    ("writer", ["jpeg", "cls"], "skip"),
    ("writer", ["jpg;jpeg", "cls"], "empty"),
]


@pytest.mark.parametrize("name,ext,missing", CASES, ids=[f"{n}-{'+'.join(e)}-{m}" for n, e, m in CASES])
def test_loaderdataset_matches_as_webdataset(served: tuple[Daemon, dict[str, list[str]]], name: str, ext: list[str],
                                             missing: str) -> None:
    """LoaderDataset's samples are the webdataset library's, in its order."""
    d, paths = served
    want = _library(paths[name], ext, missing)
    assert want and any(all(c for c in t) for t in want), "the library finds whole samples here"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # skip's count: test_skip_says_how_many_once_an_epoch
        got = _dataset(d, name, ext, missing)
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a == b, (i, [len(x) for x in a], [len(x) for x in b])


def test_skip_says_how_many_once_an_epoch(served: tuple[Daemon, dict[str, list[str]]]) -> None:
    """Skip that leaves samples out warns once an epoch, with the daemon's
    count and, per ext entry, how many lack it."""
    d, paths = served
    total = sum(1 for _ in webdataset.WebDataset(paths["mixed"], shardshuffle=False, empty_check=False))
    kept = len(_library(paths["mixed"], ["jpeg", "cls"], "skip"))
    no_jpeg = sum(1 for s in webdataset.WebDataset(paths["mixed"], shardshuffle=False, empty_check=False)
                  if "jpeg" not in s)
    no_cls = sum(1 for s in webdataset.WebDataset(paths["mixed"], shardshuffle=False, empty_check=False)
                 if "cls" not in s)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        got = _dataset(d, "mixed", ["jpeg", "cls"], "skip", epochs=3)
    assert len(got) == 3 * kept
    told = [str(w.message) for w in caught if "left out" in str(w.message)]
    assert len(told) == 3, told
    for e, msg in enumerate(told):
        assert f"epoch {e}:" in msg and f"left out {total - kept} samples" in msg, msg
        assert f"{no_jpeg} lack 'jpeg'" in msg and f"{no_cls} lack 'cls'" in msg, msg
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        _dataset(d, "imagenet", ["jpeg", "cls"], "skip")
    assert not [w for w in caught if "left out" in str(w.message)], "nothing left out, nothing said"


def test_unmatched_ext_refused_at_open(served: tuple[Daemon, dict[str, list[str]]]) -> None:
    """An ext entry no member has is refused when the session opens,
    naming the tars' extensions (and the dot); an upper-case one under
    webdataset's rule before it is sent. DALI gives empty outputs."""
    d, paths = served
    for ext, words in ((["png", "cls"], ["ext[0] 'png'", '"JPEG", "cls"']),
                       ([".jpeg", ".cls"], ["ext[0] '.jpeg'", "without its dot", '"jpeg", not ".jpeg"'])):
        ds = LoaderDataset("imagenet", socket=d.socket, batch_size=5, ext=ext)
        with pytest.raises(BadRequestError) as ei:
            len(ds)
        msg = str(ei.value).replace('\\"', '"')
        for w in words:
            assert w.replace("'", '"') in msg, (w, msg)
    with pytest.raises(ValueError, match="'jpeg'"):
        LoaderDataset("imagenet", socket=d.socket, batch_size=5, ext=["JPEG", "cls"])
    # Through DALI: case-sensitive "jpeg" matches no member of ImageNet's
    # shards; fn.readers.webdataset gives every image empty, nvfeed refuses.
    dali = _dali(paths["imagenet"], ["jpeg", "cls"], "empty", 8)
    assert all(t[0] == b"" for t in dali)
    with pytest.raises(Exception, match='ext\\[0\\] \\\\?"jpeg\\\\?" fills no output.*case-sensitively'):
        _dali(paths["imagenet"], ["jpeg", "cls"], "empty", 8, ours=(d, "imagenet"))


def _dali(paths: list[str], ext: list[str], missing: str, count: Optional[int] = None,
          ours: Optional[tuple[Daemon, str]] = None, **kw: Any) -> list[tuple[bytes, ...]]:
    """The samples of fn.readers.webdataset over paths, or, with ours (a
    daemon and a dataset's name), of nvfeed.dali.reader in its place: the
    first count, or one epoch."""
    @pipeline_def(batch_size=4, num_threads=1, device_id=None)
    def pipe() -> Any:
        if ours is None:
            outs = fn.readers.webdataset(paths=paths, ext=ext, missing_component_behavior=missing, name="r", **kw)
        else:
            outs = nvfeed.dali.reader(ours[1], socket=ours[0].socket, ext=ext, missing_component_behavior=missing,
                                      name="r", **kw)
        return tuple(outs)

    p = pipe()
    p.build()
    n = p.epoch_size("r") if count is None else count
    got: list[tuple[bytes, ...]] = []
    while len(got) < n:
        outs = p.run()
        got += [tuple(np.asarray(o[i]).tobytes() for o in outs) for i in range(len(outs[0]))]
    return got[:n]


@pytest.mark.parametrize("ext,kw", [(["JPEG;jpg", "cls"], {}), (["jpeg", "cls"], {"case_sensitive_extensions": False}),
                                    (["Jpeg", "CLS"], {})], ids=["cs", "ci", "cs-mixed"])
def test_dali_reader_case_sensitive_as_dali(served: tuple[Daemon, dict[str, list[str]]], ext: list[str],
                                            kw: dict[str, Any]) -> None:
    """nvfeed.dali.reader matches as fn.readers.webdataset: case-sensitive
    unless told otherwise; skip leaves out the same samples."""
    d, paths = served
    want = _dali(paths["mixed"], ext, "skip", **kw)
    assert want and any(all(c for c in t) for t in want), "DALI finds whole samples here"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _dali(paths["mixed"], ext, "skip", len(want), (d, "mixed"), **kw)
    assert got == want
