# SPDX-License-Identifier: Apache-2.0
"""WebDataset datasets through the client, against real DALI (CPU) and
the webdataset library: tar shards on the session's ext4 loop, mapped
with ``mkbmap --reader webdataset`` and served by a real loaderd.

``LoaderSource(NAME, ext=[...])`` yields, sample by sample and epoch
after epoch, the components ``fn.readers.webdataset`` yields, in its
order (unshuffled and ``shuffle="dali"``), over several shard counts,
with and without ``pad_last_batch``, with ``;`` alternatives and each
``missing_component_behavior``; unshuffled it holds the multiset
``webdataset.WebDataset(...).to_tuple(...)`` does; ``nvfeed.dali.reader``
swaps in for ``fn.readers.webdataset`` in a training pipeline (DALI's
iterator, decoding, the same seed); ``LoaderDataset`` feeds a PyTorch
training loop."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from conftest import BIN, Daemon, Dataset, start_daemon, stop_daemon

try:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def
except Exception as e:  # noqa: BLE001 - any import failure means no DALI here
    pytest.skip(f"cannot import nvidia.dali: {e!r}", allow_module_level=True)

import nvfeed.dali
from nvfeed import BadRequestError, LoaderSource


def _jpeg(rng: np.random.Generator, w: int, h: int) -> bytes:
    from PIL import Image
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def _add(t: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    t.addfile(ti, io.BytesIO(data))


def _write(root: Path, shards: int, per_shard: int) -> list[str]:
    """Shards of samples with a .jpg (a real JPEG, or a .png in its place
    every 6th), a .cls (missing every 5th) and a .json every 3rd."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(shards)
    for s in range(shards):
        with tarfile.open(root / f"part-{s:03d}.tar", "w") as t:
            for j in range(per_shard + s):  # uneven shards
                i = s * 1000 + j
                k = f"k{i:06d}"
                _add(t, f"{k}.{'png' if i % 6 == 5 else 'jpg'}", _jpeg(rng, 16 + i % 9, 12 + i % 5))
                if i % 5 != 4:
                    _add(t, f"{k}.cls", str(i % 7).encode())
                if i % 3 == 0:
                    _add(t, f"{k}.json", b'{"i": %d}' % i)
    os.sync()
    return sorted(str(p) for p in root.glob("*.tar"))


@pytest.fixture(scope="module", params=[1, 3], ids=["1shard", "3shards"])
def wds(request: pytest.FixtureRequest, dataset: Dataset,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, list[str]]]:
    """A daemon serving "wds": tar shards on the test filesystem."""
    n = request.param
    root = dataset.root.parent / f"wds{n}"
    paths = _write(root, n, 37)
    work = tmp_path_factory.mktemp(f"wds{n}")
    bmap = work / "wds.bmap"
    subprocess.run([str(BIN / "mkbmap"), "--reader", "webdataset", "--mountpoint", str(root), "-o", str(bmap)],
                   check=True, capture_output=True)
    d = start_daemon(work, dataset.bmap, "--dataset", f"wds={bmap}")
    yield d, paths
    assert stop_daemon(d) == 0, d.log.read_text()


def _dali_stream(paths: list[str], ext: list[str], missing: str, count: int, batch: int, **kw: Any) -> list[tuple[bytes, ...]]:
    """The first count samples fn.readers.webdataset yields (its batches
    run on across epochs), each its outputs' bytes."""
    @pipeline_def(batch_size=batch, num_threads=1, device_id=None)
    def pipe() -> Any:
        outs = fn.readers.webdataset(paths=paths, ext=ext, missing_component_behavior=missing, **kw)
        return tuple(outs) if isinstance(outs, (list, tuple)) else (outs,)

    p = pipe()
    p.build()
    got: list[tuple[bytes, ...]] = []
    while len(got) < count:
        outs = p.run()
        got += [tuple(np.asarray(o[i]).tobytes() for o in outs) for i in range(len(outs[0]))]
    return got[:count]


def _ours(sock: str, ext: list[str], missing: str, epochs: int, batch: int, **kw: Any) -> list[tuple[bytes, ...]]:
    """epochs epochs of LoaderSource, each sample its outputs' bytes."""
    got: list[tuple[bytes, ...]] = []
    with LoaderSource("wds", socket=sock, batch_size=batch, ext=ext, missing_component_behavior=missing, **kw) as src:
        assert src.reader == "webdataset" and src.components == len(ext)
        for _ in range(epochs):
            for outs in src:
                assert len(outs) == len(ext)
                got += [tuple(o.tobytes() for o in sample) for sample in zip(*outs)]
    return got


CASES = [  # ext, missing_component_behavior
    (["jpg", "cls"], "empty"),
    (["jpg", "cls"], "skip"),
    (["jpg;png", "cls;json"], "empty"),
    (["jpg;png"], "skip"),
    (["json", "jpg"], "skip"),
]
SAMPLING = [  # DALI's reader arguments (and ours)
    dict(),
    dict(random_shuffle=True, seed=5, initial_fill=16),
    dict(random_shuffle=True, seed=7, num_shards=2, shard_id=1, pad_last_batch=True),
    dict(num_shards=3, shard_id=0, pad_last_batch=True, stick_to_shard=True),
]


@pytest.mark.parametrize("sampling", SAMPLING, ids=["plain", "shuffled", "shuffled-2shards-padded", "3shards-stick"])
@pytest.mark.parametrize("ext,missing", CASES, ids=[f"{'+'.join(e)}-{m}" for e, m in CASES])
def test_samples_and_order_as_dali(wds: tuple[Daemon, list[str]], ext: list[str], missing: str,
                                   sampling: dict[str, Any]) -> None:
    d, paths = wds
    batch = 8
    ours = _ours(d.socket, ext, missing, 2, batch, shuffle="dali", **sampling)
    assert ours and all(len(s) == len(ext) for s in ours)
    want = _dali_stream(paths, ext, missing, len(ours), batch, **sampling)
    for i, (a, b) in enumerate(zip(ours, want)):
        assert a == b, f"sample {i} of {len(ours)}: ours {[x[:8] for x in a]} DALI {[x[:8] for x in b]}"


def test_missing_error_refused_as_dali(wds: tuple[Daemon, list[str]]) -> None:
    d, paths = wds
    with pytest.raises(RuntimeError):
        _dali_stream(paths, ["jpg", "cls"], "error", 1, 4)
    with pytest.raises(BadRequestError, match="(?i)missing|underfull"):
        LoaderSource("wds", socket=d.socket, ext=["jpg", "cls"], missing_component_behavior="error")


def test_multiset_as_webdataset(wds: tuple[Daemon, list[str]]) -> None:
    """One unshuffled epoch holds what webdataset.WebDataset yields
    (samples with every component asked), each once; and one permuted
    epoch holds the same."""
    import webdataset
    d, paths = wds
    lib = Counter(webdataset.WebDataset(paths, shardshuffle=False, empty_check=False)
                  .select(lambda s: "jpg" in s and "cls" in s).to_tuple("jpg", "cls"))
    for kw in (dict(), dict(random_shuffle=True, seed=3)):
        ours = Counter(_ours(d.socket, ["jpg", "cls"], "skip", 1, 16, **kw))
        assert ours == lib, kw


def test_global_shuffle_is_new_each_epoch(wds: tuple[Daemon, list[str]]) -> None:
    d, _ = wds
    got = _ours(d.socket, ["jpg"], "skip", 2, 8, random_shuffle=True, seed=1)
    half = len(got) // 2
    assert sorted(got[:half]) == sorted(got[half:]) and got[:half] != got[half:]


def test_dali_training_pipeline_swap(wds: tuple[Daemon, list[str]]) -> None:
    """nvfeed.dali.reader in fn.readers.webdataset's place, no seed given
    (the pipeline's): DALI's iterator sees the same epochs, and the
    decoded, randomly augmented images and the labels (dtypes INT32...
    as text bytes: cls reinterpreted) are the reader's."""
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
    from nvidia.dali.plugin.pytorch import DALIGenericIterator
    d, paths = wds

    def build(ours: bool) -> Any:
        @pipeline_def(batch_size=8, num_threads=1, device_id=None, seed=11)
        def pipe() -> Any:
            kw = dict(ext=["jpg;png", "cls"], missing_component_behavior="skip", random_shuffle=True,
                      initial_fill=32, pad_last_batch=True, name="Reader")
            jpegs, cls = (nvfeed.dali.reader("wds", socket=d.socket, **kw) if ours
                          else fn.readers.webdataset(paths=paths, **kw))
            images = fn.decoders.image(jpegs, device="cpu")
            images = fn.resize(images, resize_x=fn.random.uniform(range=[8, 16]), resize_y=8)
            return fn.crop(images, crop=[8, 8]), cls

        p = pipe()
        p.build()
        return DALIGenericIterator(p, ["x", "y"], reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL)

    want, got = build(False), build(True)
    assert len(want) == len(got)
    for _ in range(2):
        for a, b in zip(want, got):
            assert (a[0]["x"] == b[0]["x"]).all() and (a[0]["y"] == b[0]["y"]).all()


def test_dali_reader_dtypes_and_refusals(wds: tuple[Daemon, list[str]]) -> None:
    d, paths = wds

    @pipeline_def(batch_size=4, num_threads=1, device_id=None)
    def pipe() -> Any:
        return nvfeed.dali.reader("wds", socket=d.socket, ext=["cls"], missing_component_behavior="skip",
                                  dtypes=types.INT8, seed=0)

    p = pipe()
    p.build()
    (cls,) = p.run()
    assert cls.dtype == types.INT8 and all(np.asarray(cls[i]).tobytes().isdigit() for i in range(len(cls)))
    for bad, says in (("paths", "mkbmap --reader webdataset"), ("index_paths", "--index-paths")):
        with pytest.raises(TypeError, match=says):
            LoaderSource("wds", socket=d.socket, ext=["jpg"], **{bad: paths})

    @pipeline_def(batch_size=4, num_threads=1, device_id=None)
    def no_ext() -> Any:
        return nvfeed.dali.reader("wds", socket=d.socket)

    with pytest.raises(TypeError, match="ext="):
        no_ext()


def test_pytorch_training_loop(wds: tuple[Daemon, list[str]]) -> None:
    """LoaderDataset over the tars: bytes per component (copies, valid
    after the next batch), .cls decoded into int64 labels where asked, a
    model trained on the decoded images."""
    import torch
    from PIL import Image
    from nvfeed.torch import LoaderDataset
    d, _ = wds
    ds = LoaderDataset("wds", socket=d.socket, batch_size=8, ext=["jpg", "cls"], missing_component_behavior="skip",
                       random_shuffle=True, decode_labels=True, shard_id=0, num_shards=1)
    model = torch.nn.Linear(3, 7)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept: list[bytes] = []
    seen = 0
    for jpegs, labels in ds:
        assert isinstance(jpegs[0], bytes) and labels.dtype == torch.int64 and labels.shape == (len(jpegs),)
        kept.append(jpegs[0])
        x = torch.stack([torch.tensor(np.asarray(Image.open(io.BytesIO(j)).convert("RGB")), dtype=torch.float32)
                         .mean(dim=(0, 1)) / 255 for j in jpegs])
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen += len(jpegs)
    assert seen > 0 and all(Image.open(io.BytesIO(k)).format == "JPEG" for k in kept)
    raw = LoaderDataset("wds", socket=d.socket, batch_size=8, ext=["jpg", "cls"], missing_component_behavior="skip",
                        shard_id=0, num_shards=1)
    jpegs, cls = next(iter(raw))
    assert all(isinstance(c, bytes) and c.isdigit() for c in cls)
    # Two padded ranks: the loop sees each rank's samples, the padding
    # trimmed from every component alike, and the two hold every sample.
    seen_by_rank = []
    for rank in range(2):
        ranked = LoaderDataset("wds", socket=d.socket, batch_size=8, ext=["jpg", "cls"],
                               missing_component_behavior="skip", shard_id=rank, num_shards=2, pad_last_batch=True)
        got = []
        for jpegs, cls in ranked:
            assert len(jpegs) == len(cls)
            got += list(zip(jpegs, cls))
        seen_by_rank.append(got)
    assert Counter(seen_by_rank[0] + seen_by_rank[1]) == Counter(_ours(d.socket, ["jpg", "cls"], "skip", 1, 8))
