# SPDX-License-Identifier: Apache-2.0
"""Real DALI, CPU only: a tensor dataset served by loaderd and read through
``fn.external_source(LoaderSource)`` gives what ``fn.readers.numpy`` gives
over the same ``.npy`` files, and a file list what ``fn.readers.file``
gives over it.

The datasets are made by ``np.save`` on the session's loop-device ext4
(conftest's ``dataset`` fixture), mapped with ``mkbmap --reader numpy``
(``--file-list`` for the lists), served by one real ``loaderd``. Each
comparison runs both pipelines over two epochs and compares every sample:

- unshuffled: the same arrays (values, dtype, shape) in the same order,
  for several shard splits, ``pad_last_batch`` on and off,
  ``stick_to_shard``, with DALI's batches running across the epoch
  boundary where they do;
- shuffled (``random_shuffle=True``): ``shuffle="dali"`` gives DALI's own
  order; both shuffles give DALI's samples per epoch and shard (the
  multiset; with ``pad_last_batch`` the set, since the padding repeats
  whichever sample came last);
- every backend (file, gds, bam) on a dense and a ragged dataset.

What DALI itself does here was checked first (see bmap's testdata and
``docs/mkbmap.md``): ``fn.readers.numpy`` is not recursive (root files,
then immediate subdirectories), its order, sharding, padding and shuffle
are ``fn.readers.file``'s over the same sorted list, and it fails on a
batch mixing dtypes or numbers of dimensions, which mkbmap refuses.

Per the design, ``LoaderSource`` over a numpy dataset yields the arrays
alone: one ``(B, *shape)`` ndarray viewing the batch memory when its
samples share dtype, shape (and size > 0), else a list of arrays."""

from __future__ import annotations

import collections
import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import pytest

from conftest import BIN, Daemon, Dataset, need_raw, skip_unprivileged, start_daemon, stop_daemon
from nvfeed import LoaderSource

try:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def
except Exception as e:  # noqa: BLE001 - any import failure means no DALI here
    pytest.skip(f"cannot import nvidia.dali: {e!r}", allow_module_level=True)

EPOCHS = 2
Key = tuple[str, tuple[int, ...], bytes]  # one array: dtype descr, shape, data


def key(a: np.ndarray) -> Key:
    return (a.dtype.str, tuple(a.shape), np.ascontiguousarray(a).tobytes())


def show(k: Key) -> str:
    return f"{k[0]}{k[1]} #{hashlib.sha256(k[2]).hexdigest()[:8]}"


# --- the datasets -------------------------------------------------------------

@dataclass
class Spec:
    """A generated dataset: n arrays made by make(rng, i); nested puts
    files in the root and in two subdirectories (and one deeper, ignored,
    of another dtype); offset, where given, is where the i-th file's data
    starts (its header padded by hand, as DALI reads it: a multiple of
    16), else np.save writes it."""
    make: Callable[[np.random.Generator, int], np.ndarray]
    n: int
    nested: bool = False
    offset: Optional[Callable[[int], int]] = None


def _rand(dtype: str, shape: tuple[int, ...]) -> Callable[[np.random.Generator, int], np.ndarray]:
    def make(rng: np.random.Generator, i: int) -> np.ndarray:
        dt = np.dtype(dtype)
        if dt == np.bool_:
            return rng.integers(0, 2, shape).astype(bool)
        if dt.kind in "iu":
            info = np.iinfo(dt)
            return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
        return (rng.standard_normal(shape) * 100).astype(dt)
    return make


def _ragged_f4(rng: np.random.Generator, i: int) -> np.ndarray:
    shape = (1 + i % 4, (i * 5) % 7, 3)  # (k, 0, 3) every 7th: empty arrays
    return rng.standard_normal(shape).astype(np.float32)


def _ragged_u1(rng: np.random.Generator, i: int) -> np.ndarray:
    n = [0, 4096, 4097, 1, 9000, 12288][i] if i < 6 else int(rng.integers(0, 9000))
    return rng.integers(0, 256, n, dtype=np.uint8)


def _mostly_dense_i4(rng: np.random.Generator, i: int) -> np.ndarray:
    return rng.integers(-1000, 1000, (4, 5 if i in (6, 7, 19) else 4), dtype=np.int32)


SPECS: dict[str, Spec] = {
    "u1_1d": Spec(_rand("u1", (4097,)), 23),          # a row of 4097 bytes: not a multiple of 4096
    "i2_4d": Spec(_rand("<i2", (2, 3, 4, 5)), 29, nested=True),
    "i4_0d": Spec(lambda rng, i: np.array(i * 37 - 400, dtype="<i4"), 21),
    "i8_2d": Spec(_rand("<i8", (7, 9)), 23),
    "f2_3d": Spec(_rand("<f2", (2, 50, 50)), 19),       # 10000 bytes
    "f4_3d": Spec(_rand("<f4", (3, 5, 7)), 37),
    "f8_2d": Spec(_rand("<f8", (3, 700)), 17),          # 16800 bytes
    "b1_1d": Spec(_rand("|b1", (1000,)), 23),
    "f4_ragged": Spec(_ragged_f4, 31, nested=True),
    "u1_ragged": Spec(_ragged_u1, 25),
    "i4_mostly_dense": Spec(_mostly_dense_i4, 27),
    # One shape, data at other phases in their files (80 .. 8240): a batch is dense only where they agree.
    "f4_phases": Spec(_rand("<f4", (3, 333)), 22, offset=lambda i: 128 if i < 10 else [80, 4096, 1008, 8192 + 48][i % 4]),
}
DENSE = [n for n in SPECS if "ragged" not in n and "mostly" not in n and "phases" not in n]


@dataclass
class Served:
    daemon: Daemon
    roots: dict[str, Path]  # dataset name -> its root (file_root)
    lists: dict[str, dict[str, Any]]  # list dataset name -> DALI reader arguments
    raw: Dataset


def _write_npy(root: Path, name: str, spec: Spec) -> None:
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little"))
    for i in range(spec.n):
        rel = f"{i:03d}.npy"
        if spec.nested and i % 3:
            rel = f"{'ba'[i % 2]}/{rel}"
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        a = spec.make(rng, i)
        if spec.offset is None:
            np.save(p, a)
            continue
        header = f"{{'descr': '{a.dtype.str}', 'fortran_order': False, 'shape': {a.shape}, }}"
        pad = spec.offset(i) - 10 - len(header) - 1
        assert pad >= 0 and spec.offset(i) % 16 == 0
        header += " " * pad + "\n"
        p.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + a.tobytes())
    if spec.nested:
        (root / "a" / "deep").mkdir(parents=True)
        np.save(root / "a" / "deep" / "000.npy", np.zeros(3, np.complex64))  # neither DALI nor mkbmap looks here
        (root / "notes.txt").write_text("not an array")


def _mkbmap(*args: str) -> None:
    r = subprocess.run([str(BIN / "mkbmap"), *args], capture_output=True, text=True)
    if r.returncode != 0:
        skip_unprivileged(f"mkbmap {' '.join(args)}: {r.stderr.strip()}")


def _encoded_list(base: Path) -> tuple[Path, Path, list[str], list[int]]:
    """Files of random bytes in nested folders, a file_list naming them
    (duplicates, './', an absolute path, a CRLF line, a blank line, a
    name with a space) and the files/labels form's lists."""
    root = base / "enc"
    rng = np.random.default_rng(17)
    names = [f"{'xyz'[i % 3]}/{'deep/' if i % 5 == 0 else ''}{i:02d}{' sp' if i == 4 else ''}.bin" for i in range(26)]
    for i, n in enumerate(names):
        (root / n).parent.mkdir(parents=True, exist_ok=True)
        (root / n).write_bytes(rng.integers(0, 256, 100 + 613 * i, dtype=np.uint8).tobytes())
    lines = [f"{n} {(i * 7) % 11}" for i, n in enumerate(names)]
    lines += [f"./{names[3]} 42", f"{root}/{names[8]} 8", "", f"{names[0]} 5\r", f"{names[0]} 0"]
    lst = base / "enc.txt"
    lst.write_text("\n".join(lines) + "\n")
    files = names[::-1][:15] + [names[2]]
    labels = [int(x) for x in rng.integers(-5, 1000, len(files))]
    return root, lst, files, labels


@pytest.fixture(scope="module")
def served(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = dataset.root.parent / "npconf"
    maps = tmp_path_factory.mktemp("npconf-maps")
    roots: dict[str, Path] = {}
    lists: dict[str, dict[str, Any]] = {}
    args: list[str] = []
    for name, spec in SPECS.items():
        root = base / name
        _write_npy(root, name, spec)
        roots[name] = root
    enc, lst, files, labels = _encoded_list(base)
    nlist = base / "f4_ragged.txt"  # fn.readers.numpy(file_list=): verbatim paths, duplicates kept
    rel = sorted(str(p.relative_to(roots["f4_ragged"])) for p in roots["f4_ragged"].rglob("*.npy") if "deep" not in p.parts)
    nlist.write_text("\n".join(rel[::-2] + [rel[0], f"./{rel[1]}", str(roots["f4_ragged"] / rel[2])]) + "\n")
    nfiles = rel[5:17] + rel[5:7]
    os.sync()
    for name, root in roots.items():
        _mkbmap("--reader", "numpy", "--mountpoint", str(root), "-o", str(maps / f"{name}.bmap"))
        args += ["--dataset", f"{name}={maps / f'{name}.bmap'}"]
    _mkbmap("--file-list", str(lst), "--mountpoint", str(enc), "-o", str(maps / "enc_list.bmap"))
    lists["enc_list"] = dict(reader="file", file_root=str(enc), file_list=str(lst))
    _mkbmap("--mountpoint", str(enc), "--labels", ",".join(map(str, labels)), "-o", str(maps / "enc_files.bmap"), *files)
    lists["enc_files"] = dict(reader="file", file_root=str(enc), files=files, labels=labels)
    _mkbmap("--reader", "numpy", "--file-list", str(nlist), "--mountpoint", str(roots["f4_ragged"]), "-o", str(maps / "np_list.bmap"))
    lists["np_list"] = dict(reader="numpy", file_root=str(roots["f4_ragged"]), file_list=str(nlist))
    _mkbmap("--reader", "numpy", "--mountpoint", str(roots["f4_ragged"]), "-o", str(maps / "np_files.bmap"), *nfiles)
    lists["np_files"] = dict(reader="numpy", file_root=str(roots["f4_ragged"]), files=nfiles)
    for name in lists:
        args += ["--dataset", f"{name}={maps / f'{name}.bmap'}"]
    d = start_daemon(tmp_path_factory.mktemp("npconf"), dataset.bmap, *args)
    yield Served(d, roots, lists, dataset)
    assert stop_daemon(d) == 0, d.log.read_text()


# --- reading ------------------------------------------------------------------

def dali_stream(n: int, bs: int, reader: str = "numpy", pipe_seed: int = 99, **kw: Any) -> list[Any]:
    """The first n samples of a DALI reader run with batch_size bs, one
    flat list: keys, or (key, label) for fn.readers.file."""
    @pipeline_def(batch_size=bs, num_threads=1, device_id=None, seed=pipe_seed)
    def pipe():
        if reader == "numpy":
            return fn.readers.numpy(**kw)
        return tuple(fn.readers.file(**kw))

    p = pipe()
    p.build()
    out: list[Any] = []
    while len(out) < n:
        outs = p.run()
        for i in range(len(outs[0])):
            k = key(np.array(outs[0][i]))
            out.append(k if len(outs) == 1 else (k, int(np.array(outs[1][i]).reshape(-1)[0])))
    return out[:n]


def external_epochs(src: Any, bs: int, epochs: int = EPOCHS, labels: bool = False, pipe_seed: int = 1) -> list[list[Any]]:
    """src (a LoaderSource) through fn.external_source in a DALI pipeline,
    epoch by epoch: keys, or (key, label)."""
    @pipeline_def(batch_size=bs, num_threads=1, device_id=None, seed=pipe_seed)
    def ext():
        if labels:
            return tuple(fn.external_source(source=src, num_outputs=2, batch=True, no_copy=True, dtype=[types.UINT8, types.INT32]))
        return fn.external_source(source=src, batch=True, no_copy=True)

    return pipeline_epochs(ext(), epochs)


def pipeline_epochs(p: Any, epochs: int = EPOCHS) -> list[list[Any]]:
    """A pipeline's samples epoch by epoch (an epoch ends with its
    source's StopIteration, then the pipeline is reset): keys, or (key,
    label) for two outputs."""
    p.build()
    got: list[list[Any]] = []
    for _ in range(epochs):
        ep: list[Any] = []
        while True:
            try:
                outs = p.run()
            except StopIteration:
                p.reset()
                break
            for i in range(len(outs[0])):
                k = key(np.array(outs[0][i]))
                ep.append(k if len(outs) == 1 else (k, int(np.array(outs[1][i]).reshape(-1)[0])))
        got.append(ep)
    return got


def epoch_lengths(n: int, bs: int, shards: int, sid: int, pad: bool, stick: bool, epochs: int = EPOCHS) -> list[int]:
    """How many samples each epoch of DALI's shard holds (shards rotate
    each epoch unless stick_to_shard; pad_last_batch fills the last batch
    of the largest shard's size)."""
    per = -(-n // shards)
    out = []
    for e in range(epochs):
        k = sid if stick else (sid + e) % shards
        out.append(-(-per // bs) * bs if pad else (k + 1) * n // shards - k * n // shards)
    return out


def open_source(s: Served, name: str, bs: int, **kw: Any) -> LoaderSource:
    return LoaderSource(name, socket=s.daemon.socket, batch_size=bs, **kw)


def compare(got: list[list[Any]], want: list[Any], lengths: list[int], what: str) -> None:
    """got's epochs, flattened, are want, sample by sample; each epoch has
    its length."""
    assert [len(e) for e in got] == lengths, f"{what}: epoch lengths {[len(e) for e in got]}, DALI's {lengths}"
    flat = [x for e in got for x in e]
    assert len(want) == len(flat)
    for i, (g, w) in enumerate(zip(flat, want)):
        if g != w:
            gs, ws = (show(g), show(w)) if isinstance(g[0], str) else ((show(g[0]), g[1]), (show(w[0]), w[1]))
            pytest.fail(f"{what}: sample {i} is {gs}, DALI's {ws}")


# --- unshuffled: same arrays, same order --------------------------------------

# (dataset, batch_size, num_shards, shard_id, pad_last_batch, stick_to_shard)
SHARDS = [(1, 0), (2, 1), (3, 2), (4, 1)]
UNSHUFFLED = [(name, bs, shards, sid, pad, stick)
              for j, (shards, sid) in enumerate(SHARDS)
              for pad in (False, True) for stick in (False, True)
              for name, bs in [(["f4_3d", "i2_4d", "u1_1d", "f8_2d"][j], 4), (["f4_ragged", "u1_ragged", "i4_mostly_dense", "f4_ragged"][j], 5)]]
UNSHUFFLED += [(name, 6, 2, 0, True, False) for name in SPECS]  # every dataset
UNSHUFFLED += [("i4_0d", 32, 1, 0, pad, False) for pad in (False, True)]  # a batch larger than the dataset


@pytest.mark.parametrize("case", UNSHUFFLED, ids=["-".join(map(str, c)) for c in UNSHUFFLED])
def test_unshuffled_matches_readers_numpy(served: Served, case: tuple) -> None:
    name, bs, shards, sid, pad, stick = case
    kw = dict(num_shards=shards, shard_id=sid, pad_last_batch=pad, stick_to_shard=stick)
    lengths = epoch_lengths(SPECS[name].n, bs, shards, sid, pad, stick)
    with open_source(served, name, bs, random_shuffle=False, **kw) as src:
        got = external_epochs(src, bs)
    want = dali_stream(sum(lengths), bs, file_root=str(served.roots[name]), random_shuffle=False, **kw)
    compare(got, want, lengths, name)


# --- shuffled: DALI's order (shuffle="dali"), DALI's samples ------------------

SHUFFLED = [
    ("f4_3d", 8, 1, 0, False, False, 0, 1024),
    ("f4_3d", 5, 3, 1, True, False, 42, 16),
    ("i8_2d", 4, 2, 1, False, True, 7, 7),
    ("f4_ragged", 6, 3, 2, False, False, 11, 32),
    ("u1_ragged", 4, 2, 0, True, True, 5, 1),
    ("i4_mostly_dense", 5, 1, 0, True, False, 2**32 + 3, 100),
]


def same_samples(got: list[Any], want: list[Any], pad: bool) -> bool:
    """Whether two epochs hold the same samples: as multisets, or as sets
    with pad_last_batch (the padding repeats whichever sample came last
    out of the shuffle)."""
    return set(got) == set(want) if pad else collections.Counter(got) == collections.Counter(want)


@pytest.mark.parametrize("case", SHUFFLED, ids=["-".join(map(str, c)) for c in SHUFFLED])
def test_shuffled_dali_matches_readers_numpy(served: Served, case: tuple) -> None:
    """shuffle="dali": fn.readers.numpy(random_shuffle=True)'s order,
    sample for sample (DALI's numpy reader shuffles as its file reader
    does), so each epoch of the shard holds DALI's samples."""
    name, bs, shards, sid, pad, stick, seed, fill = case
    kw = dict(num_shards=shards, shard_id=sid, pad_last_batch=pad, stick_to_shard=stick, seed=seed, initial_fill=fill)
    lengths = epoch_lengths(SPECS[name].n, bs, shards, sid, pad, stick)
    with open_source(served, name, bs, random_shuffle=True, shuffle="dali", **kw) as src:
        got = external_epochs(src, bs)
    want = dali_stream(sum(lengths), bs, file_root=str(served.roots[name]), random_shuffle=True, **kw)
    assert [len(e) for e in got] == lengths
    for e, ep in enumerate(got):
        o = sum(lengths[:e])
        assert same_samples(ep, want[o:o + lengths[e]], pad), f"epoch {e}: other samples than DALI's"
    compare(got, want, lengths, f"{name} shuffle=dali")
    unshuffled = dali_stream(lengths[0], bs, file_root=str(served.roots[name]), random_shuffle=False,
                             num_shards=shards, shard_id=sid, pad_last_batch=pad, stick_to_shard=stick)
    assert got[0] != unshuffled, "not shuffled"


@pytest.mark.parametrize("case", SHUFFLED, ids=["-".join(map(str, c)) for c in SHUFFLED])
def test_shuffled_permute_samples(served: Served, case: tuple) -> None:
    """shuffle="permute" (the default): a global permutation each epoch.
    One shard, or stick_to_shard: each epoch holds DALI's samples of the
    shard, in another order. Else the shards of an epoch together hold
    every sample once (pad_last_batch: each at least once), as DALI's
    shards of an epoch do."""
    name, bs, shards, sid, pad, stick, seed, fill = case
    root = str(served.roots[name])
    kw = dict(num_shards=shards, pad_last_batch=pad, stick_to_shard=stick, seed=seed)
    n = SPECS[name].n
    per_shard: list[list[list[Key]]] = []
    for k in range(shards):
        with open_source(served, name, bs, random_shuffle=True, shard_id=k, **kw) as src:
            per_shard.append(external_epochs(src, bs))
        assert [len(e) for e in per_shard[k]] == epoch_lengths(n, bs, shards, k, pad, stick), f"shard {k}"
    got = per_shard[sid]
    lengths = epoch_lengths(n, bs, shards, sid, pad, stick)
    want = dali_stream(sum(lengths), bs, file_root=root, random_shuffle=True, initial_fill=fill, shard_id=sid, **kw)
    everything = dali_stream(n, n, file_root=root)
    for e in range(EPOCHS):
        if shards == 1 or stick:
            o = sum(lengths[:e])
            assert same_samples(got[e], want[o:o + lengths[e]], pad), f"epoch {e}: other samples than DALI's shard"
        union = [x for k in range(shards) for x in per_shard[k][e]]
        assert same_samples(union, everything, pad), f"epoch {e}: the shards do not hold every sample once"
    assert got[0] != want[:lengths[0]] and got[0] != got[1], "not a permutation of its own"


def test_dali_reader_default_seed(served: Served) -> None:
    """nvfeed.dali.reader over a numpy dataset: one output, and with no
    seed the pipeline's, as fn.readers.numpy takes it: the same batches."""
    import nvfeed.dali

    name, bs = "f4_ragged", 4
    kw = dict(random_shuffle=True, num_shards=2, shard_id=1, pad_last_batch=True)
    lengths = epoch_lengths(SPECS[name].n, bs, 2, 1, True, False)

    @pipeline_def(batch_size=bs, num_threads=1, device_id=None, seed=1234)
    def pipe():
        return nvfeed.dali.reader(name, socket=served.daemon.socket, name="Reader", **kw)

    p = pipe()
    p.build()
    # As fn.readers.numpy, it goes on from epoch to epoch (padded: whole batches each).
    flat = [key(np.array(out[i])) for out in (p.run()[0] for _ in range(sum(lengths) // bs)) for i in range(bs)]
    got = [flat[sum(lengths[:e]):sum(lengths[:e + 1])] for e in range(len(lengths))]
    assert p.reader_meta("Reader")["epoch_size"] == SPECS[name].n
    compare(got, dali_stream(sum(lengths), bs, pipe_seed=1234, file_root=str(served.roots[name]), **kw), lengths,
            "nvfeed.dali.reader")


# --- every backend, batch_format="dali", transport="http" ---------------------

@pytest.mark.parametrize("backend", ["file", "gds", "bam"])
@pytest.mark.parametrize("name", ["f8_2d", "u1_ragged", "i4_mostly_dense", "f4_phases"])
def test_backends(served: Served, backend: str, name: str) -> None:
    need_raw(served.raw, backend)
    bs, kw = 4, dict(num_shards=2, shard_id=1, pad_last_batch=True)
    lengths = epoch_lengths(SPECS[name].n, bs, 2, 1, True, False)
    with open_source(served, name, bs, backend=backend, **kw) as src:
        got = external_epochs(src, bs)
    compare(got, dali_stream(sum(lengths), bs, file_root=str(served.roots[name]), **kw), lengths, f"{name} on {backend}")


@pytest.mark.parametrize("how", [dict(batch_format="dali"), dict(transport="http")], ids=["batch_format=dali", "transport=http"])
@pytest.mark.parametrize("name", ["f2_3d", "f4_ragged"])
def test_batch_format_and_transport(served: Served, name: str, how: dict[str, str]) -> None:
    bs = 5
    lengths = epoch_lengths(SPECS[name].n, bs, 1, 0, False, False)
    with open_source(served, name, bs, **how) as src:
        got = external_epochs(src, bs)
    compare(got, dali_stream(sum(lengths), bs, file_root=str(served.roots[name])), lengths, f"{name} {how}")


# --- what LoaderSource yields over a numpy dataset ----------------------------

def _dali_arrays(root: Path, n: int) -> list[np.ndarray]:
    @pipeline_def(batch_size=n, num_threads=1, device_id=None)
    def pipe():
        return fn.readers.numpy(file_root=str(root))

    p = pipe()
    p.build()
    (out,) = p.run()
    return [np.array(out[i]) for i in range(n)]


@pytest.mark.parametrize("name", DENSE)
def test_dense_batches_are_one_array(served: Served, name: str) -> None:
    """A batch of one dtype and shape is one (B, *shape) ndarray viewing
    the batch memory (no copy), equal to DALI's arrays stacked; no labels;
    the source says its reader."""
    bs = 4
    want = _dali_arrays(served.roots[name], SPECS[name].n)
    with open_source(served, name, bs) as src:
        assert src.reader == "numpy"
        b = -1
        for b, batch in enumerate(src):  # a batch's memory is reused once released: checked here
            rows = want[b * bs:(b + 1) * bs]
            assert isinstance(batch, np.ndarray), f"batch {b}: {type(batch).__name__}, want one ndarray (arrays alone, no labels)"
            assert batch.dtype == rows[0].dtype and batch.shape == (len(rows), *rows[0].shape), (batch.dtype, batch.shape)
            assert batch.flags.c_contiguous and not batch.flags.owndata, "a dense batch is a view of the batch memory"
            assert np.array_equal(batch, np.stack(rows)), f"batch {b}"
    assert b + 1 == -(-SPECS[name].n // bs)


@pytest.mark.parametrize("name", ["f4_ragged", "u1_ragged", "i4_mostly_dense", "f4_phases"])
def test_ragged_batches_are_lists(served: Served, name: str) -> None:
    """A batch whose shapes differ (or with an empty array, or whose data
    lie at different phases in their files) is a list of arrays, each
    with its dtype and shape, empty ones included; one whose shapes and
    phases agree is one array."""
    bs, spec = 5, SPECS[name]
    want = _dali_arrays(served.roots[name], spec.n)
    kinds = set()
    with open_source(served, name, bs) as src:
        for b, batch in enumerate(src):
            rows = want[b * bs:(b + 1) * bs]
            phases = {(spec.offset(i) if spec.offset else 128) % 4096 for i in range(b * bs, b * bs + len(rows))}
            dense = len({r.shape for r in rows}) == 1 and rows[0].size > 0 and len(phases) == 1
            kinds.add(dense)
            if dense:
                assert isinstance(batch, np.ndarray) and np.array_equal(batch, np.stack(rows)), f"batch {b}"
                continue
            assert isinstance(batch, list) and len(batch) == len(rows), f"batch {b}: {type(batch).__name__}"
            for g, w in zip(batch, rows):
                assert isinstance(g, np.ndarray) and key(g) == key(w), f"batch {b}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
    assert False in kinds, "the test read no ragged batch"
    if name in ("i4_mostly_dense", "f4_phases"):
        assert True in kinds, "the test read no dense batch"


def test_torch_dataset_dense_zero_copy(served: Served) -> None:
    """nvfeed.torch.LoaderDataset over a dense numpy dataset yields the
    batch tensor, sharing the batch memory."""
    torch = pytest.importorskip("torch")
    from nvfeed.torch import LoaderDataset

    name, bs = "i8_2d", 4
    want = _dali_arrays(served.roots[name], SPECS[name].n)
    ds = LoaderDataset(name, socket=served.daemon.socket, batch_size=bs)
    b = -1
    try:
        for b, t in enumerate(ds):  # a batch's memory is reused once released: checked here
            assert isinstance(t, torch.Tensor) and t.dtype == torch.int64, type(t)
            assert np.array_equal(t.numpy(), np.stack(want[b * bs:(b + 1) * bs])), f"batch {b}"
    finally:
        ds.close()
    assert b + 1 == -(-SPECS[name].n // bs)


def test_datasets_say_reader_and_dtype(served: Served) -> None:
    """/v1/datasets names each dataset's reader and, for numpy ones, the
    one dtype of its arrays (as the .npy descr, DALI's)."""
    import nvfeed

    info = {d["name"]: d for d in nvfeed.datasets(socket=served.daemon.socket)}
    for name, root in served.roots.items():
        first = _dali_arrays(root, 1)[0]
        assert (info[name]["reader"], info[name]["dtype"]) == ("numpy", first.dtype.str), name
        assert info[name]["samples"] == SPECS[name].n
    for name, kw in served.lists.items():
        assert info[name]["reader"] == kw["reader"], name
    assert info["enc_list"]["dtype"] == "" and info["np_list"]["dtype"] == "<f4"


# --- file lists ---------------------------------------------------------------

LIST_CASES = [(1, 0, False, False), (2, 1, False, False), (3, 2, True, False), (3, 0, False, True), (4, 3, True, True)]


@pytest.mark.parametrize("name", ["enc_list", "enc_files"])
@pytest.mark.parametrize("case", LIST_CASES, ids=["-".join(map(str, c)) for c in LIST_CASES])
def test_file_list_matches_readers_file(served: Served, name: str, case: tuple) -> None:
    """mkbmap --file-list (and the files/labels form), served: the samples
    and labels of fn.readers.file(file_list=) (files=, labels=), in order."""
    shards, sid, pad, stick = case
    bs = 4
    kw = dict(num_shards=shards, shard_id=sid, pad_last_batch=pad, stick_to_shard=stick)
    dali_kw = {k: v for k, v in served.lists[name].items() if k != "reader"}
    n = dali_stream_meta(dali_kw)
    lengths = epoch_lengths(n, bs, shards, sid, pad, stick)
    with open_source(served, name, bs, **kw) as src:
        got = external_epochs(src, bs, labels=True)
    compare(got, dali_stream(sum(lengths), bs, reader="file", **dali_kw, **kw), lengths, name)


@pytest.mark.parametrize("name", ["enc_list", "enc_files"])
def test_file_list_shuffled(served: Served, name: str) -> None:
    bs = 3
    kw = dict(num_shards=2, shard_id=0, pad_last_batch=False, seed=9, initial_fill=10)
    dali_kw = {k: v for k, v in served.lists[name].items() if k != "reader"}
    lengths = epoch_lengths(dali_stream_meta(dali_kw), bs, 2, 0, False, False)
    with open_source(served, name, bs, random_shuffle=True, shuffle="dali", **kw) as src:
        got = external_epochs(src, bs, labels=True)
    compare(got, dali_stream(sum(lengths), bs, reader="file", random_shuffle=True, **dali_kw, **kw), lengths, name)


@pytest.mark.parametrize("name", ["np_list", "np_files"])
@pytest.mark.parametrize("case", LIST_CASES[:3], ids=["-".join(map(str, c)) for c in LIST_CASES[:3]])
def test_numpy_list_matches_readers_numpy(served: Served, name: str, case: tuple) -> None:
    """mkbmap --reader numpy --file-list (and files given), served: the
    arrays of fn.readers.numpy(file_list=) (files=), in order."""
    shards, sid, pad, stick = case
    bs = 4
    kw = dict(num_shards=shards, shard_id=sid, pad_last_batch=pad, stick_to_shard=stick)
    dali_kw = {k: v for k, v in served.lists[name].items() if k != "reader"}
    lengths = epoch_lengths(dali_stream_meta(dali_kw, "numpy"), bs, shards, sid, pad, stick)
    with open_source(served, name, bs, **kw) as src:
        got = external_epochs(src, bs)
    compare(got, dali_stream(sum(lengths), bs, **dali_kw, **kw), lengths, name)


def dali_stream_meta(kw: dict[str, Any], reader: str = "file") -> int:
    """The epoch size DALI's reader gives for these arguments."""
    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():
        r = (fn.readers.numpy if reader == "numpy" else fn.readers.file)(**kw, name="r")
        return r if reader == "numpy" else tuple(r)

    p = pipe()
    p.build()
    return int(p.reader_meta("r")["epoch_size"])


def test_listed_maps_are_what_dali_lists(served: Served) -> None:
    """The list datasets are not trivial: duplicates and the list's order
    (not sorted), as DALI reads them."""
    kw = {k: v for k, v in served.lists["enc_list"].items() if k != "reader"}
    n = dali_stream_meta(kw)
    samples = dali_stream(n, 1, reader="file", **kw)
    assert n == 30 and len(set(samples)) < n and len({s[0] for s in samples}) < n
    assert [s[0] for s in samples] != sorted(s[0] for s in samples)
    with open_source(served, "enc_list", n) as src:
        batch, labels = next(iter(src))
        assert [(key(np.asarray(b)), int(np.asarray(lbl).reshape(-1)[0])) for b, lbl in zip(batch, labels)] == samples
