# SPDX-License-Identifier: Apache-2.0
"""Real DALI, CPU only: ``nvfeed.dali.reader`` in every loop DALI's users
write around ``fn.readers.file``, ``fn.readers.numpy`` and
``fn.readers.webdataset``, over the same files with the same arguments:
a plain ``pipe.run()`` loop over three epochs (DALI's readers go on into
the next epoch, never raising ``StopIteration``; without
``pad_last_batch`` an epoch's last batch is completed with the next
epoch's samples), ``pipe.epoch_size`` and ``pipe.reader_meta``, the
loop over a pipeline whose other source ends its epochs (the reader does
not move in the iteration that source ends), DALI's
PyTorch iterator with ``reader_name`` under each ``last_batch_policy``,
with ``auto_reset``, without ``reader_name``, and resumed from DALI's
checkpoint. Each gives the reader's outputs and answers, exceptions
included, over one shard, uneven rotating shards, padded shards,
``stick_to_shard`` and DALI's shuffle (``shuffle="dali"``, the seed taken from the pipeline's
as the reader takes it)."""

from __future__ import annotations

import io
import itertools
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from conftest import BIN, Daemon, Dataset, skip_unprivileged, start_daemon, stop_daemon

try:
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
except Exception as e:  # noqa: BLE001 - any import failure means no DALI here
    pytest.skip(f"cannot import nvidia.dali: {e!r}", allow_module_level=True)

import nvfeed.dali

N = 23  # samples: no shard split below is whole batches unless padded
EPOCHS = 3
Result = list[Any]


@pytest.fixture(scope="module")
def served(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, dict[str, Any]]]:
    """N samples three ways on the shared dataset's filesystem (each
    sample's bytes its own, all of one size, so that DALI's PyTorch
    iterator takes the batches): JPEG-named files in three class folders,
    .npy arrays, and two WebDataset tars of jpg and cls; one daemon
    serving them as "lf", "ln" and "lw"; what DALI's readers take for
    them."""
    base = dataset.root.parent / "loops"
    tars = base / "wds"
    tars.mkdir(parents=True)
    for i in range(N):
        f = base / "file" / f"c{i % 3}" / f"{i:03d}.jpg"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"sample %03d" % i)
        (base / "numpy").mkdir(exist_ok=True)
        np.save(base / "numpy" / f"{i:03d}.npy", np.arange(6, dtype=np.int32).reshape(2, 3) + 100 * i)
    for s, (lo, hi) in enumerate([(0, 12), (12, N)]):
        with tarfile.open(tars / f"part-{s}.tar", "w") as t:
            for i in range(lo, hi):
                for ext, data in (("jpg", b"image %03d" % i), ("cls", b"%03d" % (i % 5))):
                    ti = tarfile.TarInfo(f"k{i:03d}.{ext}")
                    ti.size = len(data)
                    t.addfile(ti, io.BytesIO(data))
    os.sync()
    args = []
    for name, kind, root in (("lf", "file", base / "file"), ("ln", "numpy", base / "numpy"), ("lw", "webdataset", tars)):
        bmap = base / f"{name}.bmap"
        r = subprocess.run([str(BIN / "mkbmap"), "--reader", kind, "--mountpoint", str(root), "-o", str(bmap)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            skip_unprivileged(f"mkbmap: {r.stderr.strip()}")
        args += ["--dataset", f"{name}={bmap}"]
    d = start_daemon(tmp_path_factory.mktemp("loops"), dataset.bmap, *args)
    yield d, {"file": {"file_root": str(base / "file")}, "numpy": {"file_root": str(base / "numpy")},
              "webdataset": {"paths": sorted(str(p) for p in tars.glob("*.tar"))}}
    assert stop_daemon(d) == 0, d.log.read_text()


class Ends:
    """An external source of its batch numbers that ends its epoch after
    ``n`` batches: DALI's readers in its pipeline do not move in the
    iteration it ends."""

    def __init__(self, n: int) -> None:
        self._n = n

    def __call__(self, info: Any) -> np.ndarray:
        if info.iteration >= self._n:
            raise StopIteration
        return np.array([info.epoch_idx, info.iteration, info.idx_in_batch], dtype=np.int32)


def _pipeline(reader: str, swap: bool, served: tuple[Daemon, dict[str, Any]], bs: int, kw: dict[str, Any],
              ends: int = 0, **pipe_kw: Any) -> Any:
    """A pipeline of the reader (named "Reader"), or of the swap in its
    place, returning its outputs (and, with ``ends``, an ``Ends(ends)``
    source's, made after the reader)."""
    d, where = served
    ext = {"ext": ["jpg", "cls"]} if reader == "webdataset" else {}

    @pipeline_def(batch_size=bs, num_threads=1, device_id=None, seed=17)
    def pipe() -> Any:
        if swap:
            out = nvfeed.dali.reader({"file": "lf", "numpy": "ln", "webdataset": "lw"}[reader], name="Reader",
                                     socket=d.socket, **ext, **kw)
        else:
            out = getattr(fn.readers, reader)(name="Reader", **where[reader], **ext, **kw)
        outs = tuple(out) if isinstance(out, (list, tuple)) else (out,)
        if ends:
            outs += (fn.external_source(source=Ends(ends), batch=False),)
        return outs

    p = pipe(**pipe_kw)
    p.build()
    return p


class Case:
    """One reader and sampling: its pipelines (``make``, the reader's or
    the swap's), batch size and outputs."""

    def __init__(self, reader: str, swap: bool, served: tuple[Daemon, dict[str, Any]], sampling: str) -> None:
        self.bs, self._kw = SAMPLING[sampling]
        self._reader, self._swap, self._served = reader, swap, served
        self.outputs = ["data"] if reader == "numpy" else ["data", "label"]

    def make(self, **pipe_kw: Any) -> Any:
        return _pipeline(self._reader, self._swap, self._served, self.bs, self._kw, **pipe_kw)

    def iterator(self, p: Any, **kw: Any) -> Any:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator
        return DALIGenericIterator(p, self.outputs, **kw)


def _batch(outs: Any) -> list[list[bytes]]:
    """A pipeline's or an iterator's outputs, sample by sample."""
    return [[np.asarray(o[i]).tobytes() for i in range(len(o))] for o in outs]


def _it_batch(b: Any) -> list[bytes]:
    return [t.numpy().tobytes() for t in b[0].values()]


def _run(c: Case) -> Result:
    """The plain loop: pipe.run() for three epochs' worth of batches, after
    the reader's epoch size and metadata."""
    p = c.make()
    steps = -(-EPOCHS * p.epoch_size("Reader") // c.bs)
    return [p.epoch_size("Reader"), p.epoch_size(), p.reader_meta("Reader"), p.reader_meta()] + [
        _batch(p.run()) for _ in range(steps)]


def _ended(c: Case) -> Result:
    """A pipe.run() loop over a pipeline whose other source ends an epoch
    every 3 batches, reset() at each end."""
    p, out = c.make(ends=3), []
    for _ in range(EPOCHS * 4):
        try:
            out.append(_batch(p.run()))
        except StopIteration:
            p.reset()
            out.append("epoch end")
    return out


def _epochs(it: Any, reset: bool) -> Result:
    """Three epochs of an iterator (reset() after each, or auto_reset), and
    its length and size."""
    out: Result = []
    for _ in range(EPOCHS):
        out.append(([_it_batch(b) for b in it], len(it), it.size))
        if reset:
            it.reset()
    return out


def _take(it: Any, n: int) -> Result:
    """n batches of the iterator, reset at each epoch's end."""
    out: Result = []
    while len(out) < n:
        try:
            out.append(_it_batch(next(it)))
        except StopIteration:
            it.reset()
            out.append("epoch end")
    return out


def _policy(name: str) -> Callable[[Case], Result]:
    """Three epochs of the iterator with reader_name under a last_batch_policy."""
    return lambda c: _epochs(c.iterator(c.make(), reader_name="Reader", last_batch_policy=LastBatchPolicy[name]),
                             reset=True)


def _checkpoint(c: Case) -> Result:
    """An iterator with reader_name over a checkpointing pipeline: 5 steps,
    then a pipeline and iterator restored from its checkpoint, 9 more."""
    kw: dict[str, Any] = dict(reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL)
    it = c.iterator(c.make(enable_checkpointing=True), **kw)
    head = _take(it, 5)
    cp = it.checkpoints()[0]
    return head + _take(c.iterator(c.make(enable_checkpointing=True, checkpoint=cp), **kw), 9)


SHAPES: dict[str, Callable[[Case], Result]] = {
    "run": _run,
    "other_source_ends": _ended,
    "partial": _policy("PARTIAL"),
    "fill": _policy("FILL"),
    "drop": _policy("DROP"),
    "auto_reset": lambda c: _epochs(c.iterator(c.make(), reader_name="Reader", auto_reset=True), reset=False),
    "no_reader_name": lambda c: [_it_batch(b) for b in itertools.islice(c.iterator(c.make()), -(-EPOCHS * N // c.bs))],
    "checkpoint": _checkpoint,
}

# name: (batch size, the reader's sampling arguments)
SAMPLING: dict[str, tuple[int, dict[str, Any]]] = {
    "one-shard": (32, {}),  # an epoch smaller than a batch: each batch holds two epochs' samples
    "uneven": (4, {"shard_id": 0, "num_shards": 2}),  # shards of 11 and 12, rotating
    "padded": (3, {"shard_id": 1, "num_shards": 3, "pad_last_batch": True}),
    "shuffled": (4, {"shard_id": 1, "num_shards": 2, "random_shuffle": True, "initial_fill": 5}),
    "sticky": (5, {"shard_id": 2, "num_shards": 3, "stick_to_shard": True}),  # its 8 samples every epoch
}


def _result(f: Callable[[], Result]) -> Result:
    """f's result, or the exception it raised, by type and message."""
    try:
        return f()
    except Exception as e:  # noqa: BLE001 - the swap must raise as the reader does
        return [type(e).__name__, str(e)]


@pytest.mark.parametrize("sampling", SAMPLING)
@pytest.mark.parametrize("reader", ["file", "numpy", "webdataset"])
@pytest.mark.parametrize("shape", SHAPES)
def test_every_loop_as_the_readers(served: tuple[Daemon, dict[str, Any]], shape: str, reader: str,
                                   sampling: str) -> None:
    pytest.importorskip("torch", reason="DALI's PyTorch iterator needs torch")
    got, want = (_result(lambda: SHAPES[shape](Case(reader, swap, served, sampling))) for swap in (True, False))
    assert got == want
