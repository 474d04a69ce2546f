# SPDX-License-Identifier: Apache-2.0
"""Numpy datasets (mkbmap --reader numpy) through a real loaderd on a
loop-device ext4: LoaderSource yields the arrays alone, each sample of its
file's dtype and shape; a batch of one shape is one (batch, *shape) view
of the batch memory (no copy), any other a list of views (0-d and empty
arrays included); a skipped sample leaves a list of the others;
batch_format="dali" gives one TensorListCPU of the same memory;
nvfeed.dali.reader is fn.readers.numpy's one output (real DALI, CPU);
nvfeed.torch.LoaderDataset yields tensors (real torch). Every array is
compared with np.load of its file."""

from __future__ import annotations

import os
import subprocess
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from conftest import BIN, Daemon, Dataset, faults_build, need_raw, start_daemon, stop_daemon
from nvfeed import LoaderSource, datasets

BACKENDS = ["file", "gds"]


def _save(root: Path, arrays: dict[str, np.ndarray]) -> list[Path]:
    """np.save's files under root; returns them in fn.readers.numpy's order
    (the root's files, then each subfolder's, bytewise)."""
    for name, a in arrays.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        np.save(root / name, a)
    os.sync()
    top = sorted((p for p in root.iterdir() if p.is_file()), key=lambda p: os.fsencode(p.name))
    subs = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: os.fsencode(p.name))
    return top + [f for d in subs for f in sorted((p for p in d.iterdir() if p.is_file()),
                                                  key=lambda p: os.fsencode(p.name))]


def _mkbmap(root: Path, out: Path) -> Path:
    r = subprocess.run([str(BIN / "mkbmap"), "--reader", "numpy", "--mountpoint", str(root), "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def _uniform(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """12 float32 arrays of one shape (3, 4, 5): every batch dense."""
    return {f"v{i:02d}.npy": rng.standard_normal((3, 4, 5)).astype(np.float32) for i in range(12)}


def _ragged(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """2-d int64 arrays of several shapes (one rank: fn.readers.numpy
    refuses a batch of mixed ranks, and mkbmap such a dataset), empty ones
    included."""
    return {"a.npy": rng.integers(-2**62, 2**62, (2, 3)), "b.npy": np.array([[-7]], dtype=np.int64),
            "c.npy": np.zeros((0, 4), dtype=np.int64), "d.npy": rng.integers(0, 9, (5, 1)),
            "e.npy": rng.integers(0, 9, (1, 3)), "s/f.npy": np.zeros((0, 3), dtype=np.int64),
            "s/g.npy": rng.integers(0, 9, (2, 3))}


class NumpyDatasets:
    """Numpy datasets next to the shared one (same filesystem), and one
    daemon serving them: "train" (the shared JPEGs), "dense", "ragged" and
    one per dtype ("dt_<name>")."""

    def __init__(self, base: Path, daemon: Daemon, files: dict[str, list[Path]]) -> None:
        self.base, self.daemon, self.files = base, daemon, files


DTYPES = [np.bool_, np.int8, np.uint16, np.int32, np.uint64, np.float16, np.float64, np.complex64]


@pytest.fixture(scope="module")
def nds(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NumpyDatasets]:
    base = dataset.root.parent / "numpy"
    rng = np.random.default_rng(4)
    sets: dict[str, dict[str, np.ndarray]] = {"dense": _uniform(rng), "ragged": _ragged(rng),
                                              "ragged2d": {"a.npy": rng.standard_normal((2, 3)).astype(np.float32),
                                                           "b.npy": rng.standard_normal((4, 1)).astype(np.float32),
                                                           "c.npy": np.zeros((0, 5), dtype=np.float32),
                                                           "d.npy": rng.standard_normal((3, 3)).astype(np.float32)}}
    for dt in DTYPES:
        a = rng.integers(0, 100, (4, 6, 2)).astype(dt) if dt is not np.complex64 else \
            (rng.standard_normal((4, 6, 2)) + 1j * rng.standard_normal((4, 6, 2))).astype(dt)
        sets[f"dt_{np.dtype(dt).name}"] = {f"{i}.npy": a[i] for i in range(4)}
    files, extra = {}, []
    work = tmp_path_factory.mktemp("npmaps")
    for name, arrays in sets.items():
        files[name] = _save(base / name, arrays)
        extra += ["--dataset", f"{name}={_mkbmap(base / name, work / f'{name}.bmap')}"]
    d = start_daemon(tmp_path_factory.mktemp("npd"), dataset.bmap, "--session-timeout", "5s", *extra)
    try:
        yield NumpyDatasets(base, d, files)
    finally:
        assert stop_daemon(d) == 0, d.log.read_text()[-3000:]


def _epoch(src: LoaderSource) -> list[Any]:
    """One epoch's batches."""
    out = []
    for b in src:
        out.append(b)
    return out


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _inside(src: LoaderSource, a: np.ndarray) -> bool:
    """Whether a views the source's batch memory (no copy)."""
    buf = src._session._buf
    lo = _address(buf)
    return np.shares_memory(a, buf) or (a.nbytes == 0 and lo <= _address(a) <= lo + buf.nbytes)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("transport", ["stream", "http"])
def test_dense_batch_is_one_view(dataset: Dataset, nds: NumpyDatasets, backend: str, transport: str) -> None:
    need_raw(dataset, backend)
    want = [np.load(f) for f in nds.files["dense"]]
    with LoaderSource("dense", socket=nds.daemon.socket, batch_size=4, zero_copy=True, backend=backend,
                      transport=transport) as src:  # type: ignore[arg-type]
        assert src.reader == "numpy"
        batches = _epoch(src)
        assert len(batches) == 3
        for k, b in enumerate(batches):
            assert isinstance(b, np.ndarray), f"batch {k}: {type(b)}, want one dense array"
            assert b.shape == (4, 3, 4, 5) and b.dtype == np.float32 and b.flags.c_contiguous
            assert b.base is src._session._mm, "the batch is not a view of the mapping itself"
            assert np.shares_memory(b, src._session._buf) and not b.flags.writeable
            for i in range(4):
                np.testing.assert_array_equal(b[i], want[4 * k + i])


def _mapped_batch_memory() -> int:
    """How many mappings of batch memory (the daemon's memfd) this process holds."""
    with open("/proc/self/maps") as f:
        return sum("nvfeed-batches" in line for line in f)


def test_close_unmaps_unless_a_batch_is_held(nds: NumpyDatasets) -> None:
    """A closed source's batch memory goes back at close, not when the
    source object is collected (which may be during the next source's
    open); a batch handed out keeps it mapped and readable."""
    want = [np.load(f) for f in nds.files["dense"]]
    before = _mapped_batch_memory()
    src = LoaderSource("dense", socket=nds.daemon.socket, batch_size=4, zero_copy=True)
    assert _mapped_batch_memory() == before + 1
    src.close()
    assert _mapped_batch_memory() == before, "closed, nothing held: still mapped"
    with LoaderSource("dense", socket=nds.daemon.socket, batch_size=4, zero_copy=True) as held_src:
        held = next(iter(held_src))
    assert _mapped_batch_memory() == before + 1, "a held batch's memory was unmapped"
    for i in range(4):
        np.testing.assert_array_equal(held[i], want[i])
    del held
    assert _mapped_batch_memory() == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_ragged_batch_is_a_list_of_views(dataset: Dataset, nds: NumpyDatasets, backend: str) -> None:
    need_raw(dataset, backend)
    want = [np.load(f) for f in nds.files["ragged"]]
    with LoaderSource("ragged", socket=nds.daemon.socket, batch_size=3, zero_copy=True, backend=backend) as src:
        got = [a for b in _epoch(src) for a in b]
        assert len(got) == len(want) == 7
        for a, w, f in zip(got, want, nds.files["ragged"]):
            assert isinstance(a, np.ndarray), f.name
            assert a.dtype == w.dtype and a.shape == w.shape, (f.name, a.dtype, a.shape, w.shape)
            np.testing.assert_array_equal(a, w)
            assert _inside(src, a), f"{f.name}: not a view of batch memory"
        assert got[1].shape == (1, 1) and int(got[1][0, 0]) == -7
        assert got[2].shape == (0, 4) and got[5].shape == (0, 3)  # empty


def test_every_dtype(nds: NumpyDatasets) -> None:
    """Each dtype comes as the file's, values and all; datasets() says the
    reader and the dtype, as .npy descrs."""
    info = {d["name"]: d for d in datasets(nds.daemon.socket)}
    assert info["train"]["reader"] == "file" and info["train"]["dtype"] == ""
    assert info["ragged"]["reader"] == "numpy" and info["ragged"]["dtype"] == "<i8"
    for dt in DTYPES:
        name = f"dt_{np.dtype(dt).name}"
        assert info[name]["reader"] == "numpy" and info[name]["dtype"] == np.dtype(dt).str, info[name]
        with LoaderSource(name, socket=nds.daemon.socket, batch_size=4) as src:
            (b,) = _epoch(src)
            assert isinstance(b, np.ndarray) and b.dtype == np.dtype(dt) and b.shape == (4, 6, 2), (name, b.dtype)
            np.testing.assert_array_equal(b, np.stack([np.load(f) for f in nds.files[name]]))


def test_file_dataset_reader(daemon: Daemon) -> None:
    with LoaderSource("train", socket=daemon.socket, batch_size=5) as src:
        assert src.reader == "file"
        samples, labels = next(src)
        assert isinstance(samples, list) and labels.shape == (5, 1)


@pytest.mark.parametrize("name,says", [("dense", r"is one array of shape \(2, 3, 4, 5\) float32"),
                                       ("ragged", r"is a list of 2 arrays \(one a sample, shapes differ\)")])
def test_batch_refuses_samples_labels_unpacking(nds: NumpyDatasets, name: str, says: str) -> None:
    """A numpy dataset's batch of 2 unpacked as an image dataset's
    (samples, labels) raises TypeError saying what it is and what to write,
    rather than splitting into two samples; iterating, indexing and len()
    still give its samples."""
    with LoaderSource(name, socket=nds.daemon.socket, batch_size=2) as src:
        with pytest.raises(TypeError, match=f"dataset '{name}' {says}: the arrays alone, without labels.*"
                                            "unpacking it into 2 names.*`for batch in src:`"):
            for samples, labels in src:
                pass
    with LoaderSource(name, socket=nds.daemon.socket, batch_size=2) as src:
        batch = next(src)
        with pytest.raises(TypeError, match="unpacking it into 3 names"):
            a, *rest, z = batch
        want = [np.load(f) for f in nds.files[name][:2]]
        assert len(batch) == 2 and [w.shape for w in want] == [a.shape for a in batch] == [batch[i].shape for i in range(2)]
        for got, w in zip(list(batch), want):
            np.testing.assert_array_equal(got, w)
        first, second = batch[0], batch[1]  # the samples one by one: not an unpacking of the batch
        np.testing.assert_array_equal(second, want[1])


@pytest.mark.parametrize("no_copy", [False, True], ids=["copy", "no_copy"])
@pytest.mark.parametrize("name", ["dense", "ragged"])
def test_external_source_takes_the_batches(nds: NumpyDatasets, name: str, no_copy: bool) -> None:
    """fn.external_source(source=LoaderSource, batch=True) over a numpy
    dataset (real DALI, CPU): one epoch of every array of its files, in
    order, dense batches and ragged lists alike."""
    pytest.importorskip("nvidia.dali")
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def

    want = [np.load(f) for f in nds.files[name]]
    with LoaderSource(name, socket=nds.daemon.socket, batch_size=2) as src:
        @pipeline_def(batch_size=2, num_threads=1, device_id=None, prefetch_queue_depth=1)
        def pipe():
            return fn.external_source(source=src, batch=True, no_copy=no_copy)

        p = pipe()
        p.build()
        got = []
        try:
            while True:
                (out,) = p.run()
                got += [np.array(out[i]) for i in range(len(out))]
        except StopIteration:
            pass
        del p
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_array_equal(g, w)


def test_dali_batch_format_views_the_memory(nds: NumpyDatasets) -> None:
    """batch_format="dali": one TensorListCPU a batch, of the batch memory
    itself: a dense batch wrapped whole, a ragged one sample by sample."""
    pytest.importorskip("nvidia.dali")
    lo, hi = 0, 0
    with LoaderSource("dense", socket=nds.daemon.socket, batch_size=4, zero_copy=True, batch_format="dali") as src:
        lo, hi = _address(src._session._buf), _address(src._session._buf) + src._session._buf.nbytes
        tl = next(src)
        assert type(tl).__name__ == "TensorListCPU" and tl.shape() == [(3, 4, 5)] * 4 and tl.is_dense_tensor()
        assert lo <= tl.data_ptr() < hi, "the TensorListCPU copied the batch"
        want = np.stack([np.load(f) for f in nds.files["dense"][:4]])
        np.testing.assert_array_equal(np.array(tl.as_tensor()), want)
    with LoaderSource("ragged2d", socket=nds.daemon.socket, batch_size=4, zero_copy=True, batch_format="dali") as src:
        lo, hi = _address(src._session._buf), _address(src._session._buf) + src._session._buf.nbytes
        tl = next(src)
        want = [np.load(f) for f in nds.files["ragged2d"]]
        assert type(tl).__name__ == "TensorListCPU" and tl.shape() == [w.shape for w in want]
        for i, w in enumerate(want):
            assert lo <= tl[i].data_ptr() <= hi, f"sample {i} copied"
            np.testing.assert_array_equal(np.array(tl[i]), w)


@pytest.mark.parametrize("backend", BACKENDS)
def test_skipped_sample_leaves_a_list(dataset: Dataset, nds: NumpyDatasets, tmp_path: Path, backend: str) -> None:
    """on_error="skip": the batch that lost a sample is a list of the
    others (views, equal to their files); the other batches stay dense."""
    need_raw(dataset, backend)
    files = nds.files["dense"]
    bmap = _mkbmap(files[0].parent, tmp_path / "dense.bmap")
    d = start_daemon(tmp_path, bmap, "--inject-eio", files[5].name, binary=faults_build())
    try:
        with LoaderSource("train", socket=d.socket, batch_size=4, zero_copy=True, backend=backend, on_error="skip") as src:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                batches = _epoch(src)
            assert any(files[5].name in str(x.message) for x in w), [str(x.message) for x in w]
            assert src.skipped_samples == 1
            assert isinstance(batches[0], np.ndarray) and isinstance(batches[2], np.ndarray)
            assert isinstance(batches[1], list) and len(batches[1]) == 3
            for a, f in zip(batches[1], files[4:5] + files[6:8]):
                assert a.shape == (3, 4, 5) and _inside(src, a)
                np.testing.assert_array_equal(a, np.load(f))
    finally:
        assert stop_daemon(d) == 0


@pytest.mark.parametrize("seeded", [False, True], ids=["pipeline-seed", "seed"])
def test_dali_reader_is_readers_numpy(nds: NumpyDatasets, seeded: bool) -> None:
    """nvfeed.dali.reader over a numpy dataset: one DataNode, the arrays of
    fn.readers.numpy (values, dtype, shape, order), and a random operator
    after it draws what it draws after fn.readers.numpy (the reader's
    operator seed kept in place)."""
    pytest.importorskip("nvidia.dali")
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def

    import nvfeed.dali
    kw = {"seed": 5} if seeded else {}

    @pipeline_def(batch_size=4, num_threads=1, device_id=None, seed=11)
    def ref():
        return fn.readers.numpy(file_root=str(nds.base / "dense"), **kw), fn.random.uniform(range=[0.0, 1.0])

    outs = []

    @pipeline_def(batch_size=4, num_threads=1, device_id=None, seed=11)
    def ours():
        out = nvfeed.dali.reader("dense", socket=nds.daemon.socket, **kw)
        outs.append(out)
        return out, fn.random.uniform(range=[0.0, 1.0])

    a, b = ref(), ours()
    a.build()
    b.build()
    assert len(outs) == 1 and type(outs[0]).__name__ == "DataNode", outs
    for it in range(3):
        (wa, wu), (ga, gu) = a.run(), b.run()
        for i in range(4):
            w, g = np.array(wa[i]), np.array(ga[i])
            assert g.dtype == w.dtype == np.float32 and g.shape == w.shape == (3, 4, 5)
            np.testing.assert_array_equal(g, w)
        assert [float(np.array(gu[i])) for i in range(4)] == [float(np.array(wu[i])) for i in range(4)], \
            f"iteration {it}: the operator after the reader drew otherwise"
    del a, b


@pytest.mark.parametrize("zero_copy", [True, False], ids=["zero_copy", "copy"])
def test_torch_dataset_yields_tensors(nds: NumpyDatasets, zero_copy: bool) -> None:
    """LoaderDataset over a numpy dataset: one tensor a dense batch
    (zero_copy: torch.from_numpy of the batch memory itself), a list of
    tensors a ragged one, 0-d and empty included, equal to np.load."""
    torch = pytest.importorskip("torch")
    from nvfeed.torch import LoaderDataset
    ds = LoaderDataset("dense", socket=nds.daemon.socket, batch_size=4, shard_id=0, num_shards=1,
                       zero_copy=zero_copy)
    want = [np.load(f) for f in nds.files["dense"]]
    n = 0
    for k, t in enumerate(ds):
        assert isinstance(t, torch.Tensor) and t.shape == (4, 3, 4, 5) and t.dtype == torch.float32
        buf = ds._passes._source()._session._buf
        inside = _address(buf) <= t.data_ptr() < _address(buf) + buf.nbytes
        assert inside == zero_copy, f"batch {k}: tensor in batch memory: {inside}"
        np.testing.assert_array_equal(t.numpy(), np.stack(want[4 * k:4 * k + 4]))
        n += 1
    assert n == 3
    ds.close()
    rs = LoaderDataset("ragged", socket=nds.daemon.socket, batch_size=4, shard_id=0, num_shards=1,
                       zero_copy=zero_copy)
    want = [np.load(f) for f in nds.files["ragged"]]
    n = 0
    for b in rs:  # zero_copy tensors are valid until the next batch: compared at once
        assert isinstance(b, list)
        for t in b:
            w = want[n]
            assert t.dtype == torch.int64 and tuple(t.shape) == w.shape
            np.testing.assert_array_equal(t.numpy(), w)
            n += 1
    assert n == len(want)
    rs.close()
