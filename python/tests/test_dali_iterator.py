# SPDX-License-Identifier: Apache-2.0
"""Real DALI and torch, CPU only: DALI's ImageNet example
(examples/dali_imagenet.py, its structure) after the one-line swap to
nvfeed.dali.reader. DALIClassificationIterator(reader_name="Reader")
sizes every epoch and drops the padding as with fn.readers.file, under
every last_batch_policy, over uneven and rotating shards, shuffled or not:
every batch, augmentations included, equals the reader's. The example
trains one rank and two (torchrun) to the same losses and weights as
with the reader, every sample trained once an epoch, padding never."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from conftest import BIN, REPO, Daemon, Dataset, skip_unprivileged, start_daemon, stop_daemon

try:
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
except Exception as e:  # noqa: BLE001 - any import failure means no DALI here
    pytest.skip(f"cannot import nvidia.dali: {e!r}", allow_module_level=True)

import nvfeed.dali

EXAMPLE = REPO / "python" / "examples" / "dali_imagenet.py"
SIZES = {"t37": 37, "v37": 37, "t17": 17}  # one class per sample: a label names its sample


def _torch() -> Any:
    """The example's module (it imports torch and DALI's PyTorch plugin)."""
    pytest.importorskip("torch", reason="DALI's PyTorch iterators need torch")
    spec = importlib.util.spec_from_file_location("dali_imagenet", EXAMPLE)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def served(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, dict[str, Path]]]:
    """Datasets of SIZES JPEGs, one class folder each, on the shared
    dataset's filesystem; one daemon serving them by those names."""
    from PIL import Image
    roots: dict[str, Path] = {}
    args: list[str] = []
    rng = np.random.default_rng(5)
    for name, n in SIZES.items():
        root = dataset.root.parent / f"iter-{name}"
        for i in range(n):
            p = root / f"class{i:03d}" / f"{name}-{i:03d}.jpg"
            p.parent.mkdir(parents=True, exist_ok=True)
            out = io.BytesIO()
            Image.fromarray(rng.integers(0, 255, (40 + i % 9, 48 + i % 5, 3), dtype=np.uint8)).save(out, format="JPEG")
            p.write_bytes(out.getvalue())
        os.sync()
        bmap = dataset.root.parent / f"iter-{name}.bmap"
        r = subprocess.run([str(BIN / "mkbmap"), "--mountpoint", str(root), "-o", str(bmap)], capture_output=True, text=True)
        if r.returncode != 0:
            skip_unprivileged(f"mkbmap: {r.stderr.strip()}")
        roots[name] = root
        args += ["--dataset", f"{name}={bmap}"]
    d = start_daemon(tmp_path_factory.mktemp("iter"), dataset.bmap, *args)
    yield d, roots
    assert stop_daemon(d) == 0, d.log.read_text()


def _iterator(ex: Any, reader: str, data: str, policy: LastBatchPolicy, *, bs: int, shards: int, shard: int,
              training: bool, stick: bool) -> Any:
    """The example's pipeline (its seed 12 + rank) and iterator, for one
    rank."""
    create = _stick_pipeline(ex) if stick else ex.create_dali_pipeline
    pipe = create(batch_size=bs, num_threads=1, device_id=None, seed=12 + shard, data_dir=data, crop=24, size=28,
                  shard_id=shard, num_shards=shards, reader=reader, is_training=training)
    pipe.build()
    return ex.DALIClassificationIterator(pipe, reader_name="Reader", last_batch_policy=policy)


def _epochs(it: Any, epochs: int) -> list[dict[str, Any]]:
    """Every batch of the iterator's next epochs, as the example's loop
    takes them (reset() after each), and its length and size."""
    out = []
    for _ in range(epochs):
        batches = [(d[0]["data"].numpy().tobytes(), d[0]["label"].reshape(-1).tolist()) for d in it]
        out.append({"batches": batches, "len": len(it), "size": it._size})
        it.reset()
    return out


# (dataset, batch size, shards, random_shuffle, stick_to_shard)
CASES = [
    ("t37", 4, 2, True, False),   # uneven shards (18, 19), rotating, shuffled
    ("t37", 4, 2, False, False),  # the same, in order
    ("t37", 5, 3, True, True),    # three shards, each kept
    ("t37", 4, 1, True, False),   # one rank: its last batch 1 sample and 3 of padding
    ("t17", 4, 2, False, False),  # shards 8 and 9: the short one's padding fills a whole batch
]


@pytest.mark.parametrize("policy", [LastBatchPolicy.PARTIAL, LastBatchPolicy.FILL, LastBatchPolicy.DROP],
                         ids=lambda p: p.name)
@pytest.mark.parametrize("case", CASES, ids=[",".join(map(str, c)) for c in CASES])
def test_iterator_batches_equal_the_readers(served: tuple[Daemon, dict[str, Path]], case: tuple, policy: LastBatchPolicy,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank, 3 epochs: the iterator's batches (images after the
    random crop and flip, labels), lengths and sizes, reader and swap
    alike."""
    ex = _torch()
    d, roots = served
    monkeypatch.setenv("NVFEED_SOCKET", d.socket)
    name, bs, shards, shuffle, stick = case
    kw: dict[str, Any] = dict(bs=bs, shards=shards, training=shuffle, stick=stick)
    seen: list[list[int]] = [[] for _ in range(3)]
    for shard in range(shards):
        want = _epochs(_iterator(ex, "file", str(roots[name]), policy, shard=shard, **kw), 3)
        got = _epochs(_iterator(ex, "nvfeed", name, policy, shard=shard, **kw), 3)
        for e, (g, w) in enumerate(zip(got, want)):
            assert (g["len"], g["size"]) == (w["len"], w["size"]), f"shard {shard} epoch {e}"
            assert len(g["batches"]) == len(w["batches"]), f"shard {shard} epoch {e}"
            for i, (gb, wb) in enumerate(zip(g["batches"], w["batches"])):
                assert gb[1] == wb[1], f"shard {shard} epoch {e} batch {i}: labels {gb[1]} here, the reader's {wb[1]}"
                assert gb[0] == wb[0], f"shard {shard} epoch {e} batch {i}: images differ"
            seen[e] += [lbl for _, labels in g["batches"] for lbl in labels]
    if policy == LastBatchPolicy.PARTIAL:
        for e, labels in enumerate(seen):  # every sample once an epoch over the ranks: no padding
            assert sorted(labels) == list(range(SIZES[name])), f"epoch {e}: {sorted(labels)}"


def _stick_pipeline(ex: Any) -> Any:
    """The example's training pipeline with stick_to_shard=True on its
    reader line (the example leaves it at its default)."""
    @pipeline_def
    def create(data_dir: str, crop: int, size: int, shard_id: int, num_shards: int, reader: str, is_training: bool) -> Any:
        shard = dict(shard_id=shard_id, num_shards=num_shards, random_shuffle=is_training, pad_last_batch=True,
                     stick_to_shard=True, name="Reader")
        if reader == "nvfeed":
            images, labels = nvfeed.dali.reader(data_dir, **shard)
        else:
            images, labels = fn.readers.file(file_root=data_dir, **shard)
        images = fn.decoders.image_random_crop(images, device="cpu", random_area=[0.1, 1.0])
        return fn.resize(images, resize_x=crop, resize_y=crop), labels
    return create


def test_iterator_resumes_from_dali_checkpoint(served: tuple[Daemon, dict[str, Path]],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The example's training iterator with enable_checkpointing: stopped
    in epoch 1, its checkpoint restores a pipeline and an iterator that go
    on with the batches the reader's uninterrupted run gives."""
    ex = _torch()
    d, roots = served
    monkeypatch.setenv("NVFEED_SOCKET", d.socket)

    def iterator(reader: str, data: str, checkpoint: Any = None) -> Any:
        pipe = ex.create_dali_pipeline(batch_size=4, num_threads=1, device_id=None, seed=12, data_dir=data, crop=24,
                                       size=28, shard_id=0, num_shards=2, reader=reader, is_training=True,
                                       enable_checkpointing=True, checkpoint=checkpoint)
        pipe.build()
        return ex.DALIClassificationIterator(pipe, reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL)

    def take(it: Any, n: int) -> list[tuple[bytes, list[int]]]:
        out: list[tuple[bytes, list[int]]] = []
        while len(out) < n:
            try:
                b = next(it)
            except StopIteration:
                it.reset()
                continue
            out.append((b[0]["data"].numpy().tobytes(), b[0]["label"].reshape(-1).tolist()))
        return out

    want = take(iterator("file", str(roots["t37"])), 15)  # 3 epochs of 5 batches (18, 19, 18 samples)
    it = iterator("nvfeed", "t37")
    head = take(it, 7)
    tail = take(iterator("nvfeed", "t37", it.checkpoints()[0]), 8)
    assert head + tail == want


def _run_example(reader: str, ranks: int, data: list[str], out: Path, socket: str) -> None:
    cmd = [sys.executable, str(EXAMPLE)] if ranks == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), str(EXAMPLE)]
    cmd += ["--reader", reader, "--classes", "37", "-b", "4", "--epochs", "2", "--crop", "24", "--val-size", "28",
            "-j", "1", "--print-freq", "3", "--dump", str(out), *data]
    env = dict(os.environ, NVFEED_SOCKET=socket, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(Path(nvfeed.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, f"{' '.join(cmd)}:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"


@pytest.mark.parametrize("ranks", [1, 2], ids=["one-rank", "torchrun-2"])
def test_example_trains_as_with_the_reader(served: tuple[Daemon, dict[str, Path]], tmp_path: Path, ranks: int) -> None:
    """The example, run as a user runs it: with fn.readers.file, then with
    the swap. Each rank saw the same batches (labels, image digests), had
    the same losses and ended with the same weights; over the ranks every
    sample was trained and validated once an epoch (the shards 18 and 19,
    rotating): the padding never."""
    _torch()
    d, roots = served
    _run_example("file", ranks, [str(roots["t37"]), str(roots["v37"])], tmp_path / "file", d.socket)
    _run_example("nvfeed", ranks, ["t37", "v37"], tmp_path / "nvfeed", d.socket)
    runs = {k: [json.loads((tmp_path / k / f"rank{r}.json").read_text()) for r in range(ranks)] for k in ("file", "nvfeed")}
    for r in range(ranks):
        assert runs["nvfeed"][r] == runs["file"][r], f"rank {r}: the swap changed the run"
    for phase in ("train", "val"):
        for e in range(2):
            labels = sorted(lbl for rank in runs["nvfeed"] for ep, _, _, ls in rank[phase] if ep == e for lbl in ls)
            assert labels == list(range(37)), f"{phase} epoch {e}: {labels}"
    assert len(runs["nvfeed"][0]["loss"]) == 2 * -(-37 // ranks // 4)


def test_reader_meta_answers_as_the_readers(served: tuple[Daemon, dict[str, Path]]) -> None:
    """pipe.reader_meta(name), reader_meta() of all readers and
    pipe.epoch_size, padded or not, as fn.readers.file's (test_dali_loops
    has every loop that uses them)."""
    d, roots = served
    for pad in (True, False):
        @pipeline_def(batch_size=4, num_threads=1, device_id=None, seed=3)
        def pipes():
            a, _ = fn.readers.file(file_root=str(roots["t37"]), shard_id=1, num_shards=3, pad_last_batch=pad, name="R")
            b, _ = nvfeed.dali.reader("t37", socket=d.socket, shard_id=1, num_shards=3, pad_last_batch=pad, name="N")
            return a, b
        p = pipes()
        p.build()
        metas = p.reader_meta()
        assert metas["N"] == metas["R"] == p.reader_meta("R") == p.reader_meta("N")
        assert metas["N"]["epoch_size_padded"] == (39 if pad else 37)
        assert p.epoch_size() == {"R": p.epoch_size("R"), "N": p.epoch_size("N")}
        assert p.epoch_size("N") == p.epoch_size("R") == metas["R"]["epoch_size_padded"]


def test_reader_arguments_are_checked(served: tuple[Daemon, dict[str, Path]]) -> None:
    d, _ = served
    with pytest.raises(RuntimeError, match="call it where a pipeline is defined"):
        nvfeed.dali.reader("t37", socket=d.socket)

    @pipeline_def(batch_size=4, num_threads=1, device_id=None)
    def sized():
        return nvfeed.dali.reader("t37", socket=d.socket, batch_size=8)[0]
    with pytest.raises(TypeError, match="no argument 'batch_size' .it is the pipeline's"):
        sized()

    @pipeline_def(batch_size=4, num_threads=1, device_id=None)
    def twice():
        first, _ = nvfeed.dali.reader("t37", socket=d.socket, name="R")
        return first, nvfeed.dali.reader("t37", socket=d.socket, name="R")[0]
    with pytest.raises(ValueError, match="a reader named 'R' is already in this pipeline"):
        twice()


@pytest.mark.parametrize("pipeline_seed", [12, 13, 2**40 + 5])
def test_seed_for_is_the_unseeded_readers_seed(dataset: Dataset, pipeline_seed: int) -> None:
    """fn.readers.file without a seed, first in its pipeline, shuffles as
    with seed=seed_for(the pipeline's seed); a reader after a random
    operator takes the next one."""
    def run(seed: Any, first: bool) -> list[bytes]:
        @pipeline_def(batch_size=5, num_threads=1, device_id=None, seed=pipeline_seed)
        def p():
            flip = fn.random.coin_flip()
            kw = {} if seed is None else {"seed": seed}
            jpegs, _ = fn.readers.file(file_root=str(dataset.root), random_shuffle=True, initial_fill=8, **kw)
            return (jpegs, flip) if first else (flip, jpegs)
        pipe = p()
        pipe.build()
        out = []
        for _ in range(12):
            o = pipe.run()
            jp = o[0] if first else o[1]
            out += [np.array(jp[i]).tobytes() for i in range(len(jp))]
        return out
    assert run(None, True) == run(nvfeed.dali.seed_for(pipeline_seed), True)
    assert run(None, False) == run(nvfeed.dali.seed_for(pipeline_seed, 1), False)
    assert run(None, True) != run(nvfeed.dali.seed_for(pipeline_seed, 1), True)


def test_former_name() -> None:
    import dali_source.dali
    from dali_source.dali import reader
    assert dali_source.dali is nvfeed.dali and reader is nvfeed.dali.reader
