# SPDX-License-Identifier: Apache-2.0
"""nnU-Net's DALI loader, swapped: an adaptation of the structure of
NVIDIA DeepLearningExamples' PyTorch/Segmentation/nnUNet/data_loading/
dali_loader.py (a ``Pipeline`` subclass that makes two
``ops.readers.Numpy`` in ``__init__`` -- images ``*_x.npy`` and labels
``*_y.npy`` of one folder, ``files=`` lists computed at run time (a
k-fold split), ``shuffle_after_epoch=True``, ``pad_last_batch=True``,
sharded by rank, the pipeline's and readers' seed given or not -- calls
them in ``define_graph`` as ``ReaderX`` and ``ReaderY``, and iterates
with ``DALIGenericIterator(reader_name="ReaderX")``). The swap is the
one line per reader the README gives: ``ops.readers.Numpy(files=...)``
becomes ``nvfeed.dali.ops.readers.Numpy("x", files=...)`` over datasets
``x`` and ``y`` mapped from that folder with ``--file-filter``. Every
batch of every epoch equals real DALI's, and every image comes with its
own label."""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import pytest

from conftest import BIN, Daemon, Dataset, skip_unprivileged, start_daemon, stop_daemon

dali = pytest.importorskip("nvidia.dali")
pytorch_plugin = pytest.importorskip("nvidia.dali.plugin.pytorch")
from nvidia.dali import fn, ops  # noqa: E402
from nvidia.dali.pipeline import Pipeline  # noqa: E402

import nvfeed.dali  # noqa: E402

CASES, EPOCHS, FOLDS = 31, 3, 5


@pytest.fixture(scope="module")
def nnunet(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    root = dataset.root.parent / "nnunet-kfold"
    root.mkdir(exist_ok=True)
    for i in range(CASES):  # nnU-Net's preprocessed cases: (C, D, H, W) image and label
        np.save(root / f"case_{i:03d}_x.npy", np.full((1, 2, 2, 2), i, np.float32))
        np.save(root / f"case_{i:03d}_y.npy", np.full((1, 2, 2, 2), 1000 + i, np.int16))
    subprocess.run(["sync"], check=True)
    maps = tmp_path_factory.mktemp("nnunet-kfold-maps")
    args = []
    for part in ("x", "y"):
        out = maps / f"{part}.bmap"
        r = subprocess.run([str(BIN / "mkbmap"), "--reader", "numpy", "--file-filter", f"*_{part}.npy",
                            "--mountpoint", str(root), "-o", str(out)], capture_output=True, text=True)
        if r.returncode != 0:
            skip_unprivileged(f"mkbmap: {r.stderr.strip()}")
        args += ["--dataset", f"{part}={out}"]
    d = start_daemon(tmp_path_factory.mktemp("nnunet-kfold"), dataset.bmap, *args)
    yield d, root
    assert stop_daemon(d) == 0, d.log.read_text()
    assert "added since mapping" not in d.log.read_text(), "x and y warned of each other's files"


def kfold(root: Path, fold: int) -> tuple[list[str], list[str]]:
    """nnU-Net's split, at run time: the cases found, shuffled with a
    fixed seed, fold ``fold`` held out; the training images and labels."""
    imgs = sorted(str(p) for p in root.glob("*_x.npy"))
    order = np.random.default_rng(12345).permutation(len(imgs))
    held = set(order[fold::FOLDS].tolist())
    train = [i for i in range(len(imgs)) if i not in held]
    return [imgs[i] for i in train], [imgs[i].replace("_x.npy", "_y.npy") for i in train]


Reader = Callable[[str, list[str], dict[str, Any]], Any]


def dali_reader(part: str, files: list[str], kw: dict[str, Any]) -> Any:
    return ops.readers.Numpy(files=files, **kw)


def nvfeed_reader(socket: str) -> Reader:
    def make(part: str, files: list[str], kw: dict[str, Any]) -> Any:
        return nvfeed.dali.ops.readers.Numpy(part, files=files, socket=socket, **kw)
    return make


class TrainPipeline(Pipeline):  # type: ignore[misc]
    """nnU-Net's GenericPipeline, its readers and load_data, adapted."""

    def __init__(self, make: Reader, imgs: list[str], lbls: list[str], batch_size: int, rank: int, gpus: int,
                 seed: Optional[int], pipe_seed: Optional[int]):
        super().__init__(batch_size, 1, None, **({} if pipe_seed is None else {"seed": pipe_seed}))
        kw = dict(device="cpu", read_ahead=True, dont_use_mmap=True, pad_last_batch=True, shard_id=rank,
                  seed=seed, num_shards=gpus, shuffle_after_epoch=True)
        if seed is None:
            del kw["seed"]  # nnU-Net's unseeded run: each reader takes a seed from the pipeline
        self.input_x = make("x", imgs, kw)
        self.input_y = make("y", lbls, kw)

    def define_graph(self) -> Any:
        img = fn.reshape(self.input_x(name="ReaderX"), layout="CDHW")
        lbl = fn.reshape(self.input_y(name="ReaderY"), layout="CDHW")
        return img, lbl


def run(make: Reader, imgs: list[str], lbls: list[str], rank: int, gpus: int, seed: Optional[int],
        pipe_seed: Optional[int]) -> list[list[tuple[int, int]]]:
    """Each epoch's (image, label) case values, as nnU-Net's
    LightningWrapper(DALIGenericIterator) yields them."""
    pipe = TrainPipeline(make, imgs, lbls, 2, rank, gpus, seed, pipe_seed)
    it = pytorch_plugin.DALIGenericIterator(pipe, ["image", "label"], reader_name="ReaderX", auto_reset=True)
    epochs = []
    for _ in range(EPOCHS):
        pairs = []
        for out in it:
            img, lbl = out[0]["image"], out[0]["label"]
            pairs += [(int(img[i].flatten()[0]), int(lbl[i].flatten()[0])) for i in range(img.shape[0])]
        epochs.append(pairs)
    return epochs


@pytest.mark.parametrize("seeded", [True, False])
@pytest.mark.parametrize("gpus", [1, 2])
def test_nnunet_swap(nnunet: tuple[Daemon, Path], seeded: bool, gpus: int) -> None:
    d, root = nnunet
    imgs, lbls = kfold(root, fold=1)
    per_epoch: list[set[int]] = [set() for _ in range(EPOCHS)]
    for rank in range(gpus):
        seed, pipe_seed = (12, 7) if seeded else (None, None)
        want = run(dali_reader, imgs, lbls, rank, gpus, seed, pipe_seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # read_ahead, dont_use_mmap: ignored, as warned
            got = run(nvfeed_reader(d.socket), imgs, lbls, rank, gpus, seed, pipe_seed)
        assert got == want, f"rank {rank} of {gpus}: batches differ from fn.readers.numpy's"
        for e, pairs in enumerate(got):
            assert all(y == x + 1000 for x, y in pairs), f"rank {rank} epoch {e}: images and labels unpaired"
            per_epoch[e] |= {x for x, _ in pairs}
    train = {int(Path(p).name[5:8]) for p in imgs}
    assert all(s == train for s in per_epoch), "an epoch missed training cases"
    assert len(train) < CASES, "the fold held nothing out"


def test_ops_refuses_at_construction(nnunet: tuple[Daemon, Path]) -> None:
    """As DALI's ops readers: arguments judged when the reader is made."""
    d, _ = nnunet
    with pytest.raises(TypeError, match="file_root= is a fn.readers.numpy/fn.readers.file argument nvfeed does not support"):
        nvfeed.dali.ops.readers.Numpy("x", socket=d.socket, file_root="/data")
    with pytest.raises(TypeError, match="device='gpu'"):
        nvfeed.dali.ops.readers.Numpy("x", socket=d.socket, device="gpu")
    pipe = Pipeline(2, 1, None)
    with pipe, pytest.raises(TypeError, match="dataset 'x' is not a file dataset"):
        nvfeed.dali.ops.readers.File("x", socket=d.socket)()


def test_ops_reads_the_region_it_is_given(nnunet: tuple[Daemon, Path]) -> None:
    """The ops form passes its region of interest on to the reader: each
    array comes as that region, not whole."""
    d, _ = nnunet
    pipe = Pipeline(2, 1, None)
    with pipe:
        out = nvfeed.dali.ops.readers.Numpy("x", socket=d.socket, roi_start=[0, 1], roi_end=[2, 2], roi_axes=[1, 2])()
        pipe.set_outputs(out)
    pipe.build()
    (arrays,) = pipe.run()
    assert [tuple(arrays[i].shape()) for i in range(len(arrays))] == [(1, 2, 1, 2)] * 2
