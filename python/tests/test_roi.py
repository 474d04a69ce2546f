# SPDX-License-Identifier: Apache-2.0
"""Real DALI, CPU only: ``fn.readers.numpy``'s region-of-interest
arguments (``roi_start``, ``roi_end``, ``rel_roi_*``, ``roi_shape``,
``roi_axes``, ``out_of_bounds_policy``, ``fill_value``) given to
``LoaderSource`` read the same arrays as ``fn.readers.numpy`` given them
over the same ``.npy`` files, through every backend (file, gds, bam);
bad ones are refused at the call, naming the argument and the range."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from conftest import BIN, Daemon, Dataset, need_raw, skip_unprivileged, start_daemon, stop_daemon
from nvfeed import LoaderSource
from nvfeed._errors import LoaderError

try:
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def
except Exception as e:  # noqa: BLE001 - any import failure means no DALI here
    pytest.skip(f"cannot import nvidia.dali: {e!r}", allow_module_level=True)

N = 6
SHAPES = {"cube": lambda i: (12, 20, 24), "ragged": lambda i: (12, 20 + i % 3, 24)}
DTYPES = {"cube": "<f4", "ragged": "<i2"}


@pytest.fixture(scope="module")
def served(dataset: Dataset, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, dict[str, Path], Dataset]]:
    base = dataset.root.parent / "roi"
    maps = tmp_path_factory.mktemp("roi-maps")
    rng = np.random.default_rng(5)
    roots, args = {}, []
    for name, shape in SHAPES.items():
        root = base / name
        root.mkdir(parents=True)
        for i in range(N):
            np.save(root / f"{i:02d}.npy", (rng.standard_normal(shape(i)) * 1000).astype(DTYPES[name]))
        roots[name] = root
    os.sync()
    for name, root in roots.items():
        r = subprocess.run([str(BIN / "mkbmap"), "--reader", "numpy", "--mountpoint", str(root), "-o",
                            str(maps / f"{name}.bmap")], capture_output=True, text=True)
        if r.returncode != 0:
            skip_unprivileged(f"mkbmap: {r.stderr.strip()}")
        args += ["--dataset", f"{name}={maps / f'{name}.bmap'}"]
    d = start_daemon(tmp_path_factory.mktemp("roi"), dataset.bmap, *args)
    yield d, roots, dataset
    assert stop_daemon(d) == 0, d.log.read_text()


def dali_arrays(root: Path, **roi: Any) -> list[np.ndarray]:
    @pipeline_def(batch_size=N, num_threads=1, device_id=None)
    def pipe():
        return fn.readers.numpy(file_root=str(root), **roi)

    p = pipe()
    p.build()
    out = p.run()[0]
    return [np.array(out[i]) for i in range(len(out))]


def ours(d: Daemon, name: str, **kw: Any) -> list[np.ndarray]:
    with LoaderSource(name, socket=d.socket, batch_size=N, **kw) as src:
        batch = next(iter(src))
    return [np.array(a) for a in batch]


CASES = {
    "start_end": dict(roi_start=[2, 3, 4], roi_end=[9, 10, 20]),
    "one_axis": dict(roi_start=[5], roi_end=[6], roi_axes=[0]),
    "last_axis_rel": dict(rel_roi_start=[0.3], rel_roi_end=[0.71], roi_axes=[2]),
    "rel_shape": dict(rel_roi_start=[0.1, 0.25], rel_roi_shape=[0.5, 0.5], roi_axes=[1, 0]),
    "shape_negative_axis": dict(roi_start=[1], roi_shape=[7], roi_axes=[-2]),
    "start_only": dict(roi_start=[3, 0, 5]),
    "pad": dict(roi_start=[-3, 10], roi_end=[5, 30], roi_axes=[0, 2], out_of_bounds_policy="pad", fill_value=-7.5),
    "trim": dict(roi_start=[-3, 10], roi_end=[5, 30], roi_axes=[0, 2], out_of_bounds_policy="trim_to_shape"),
    "pad_half": dict(roi_start=[-1], roi_end=[14], roi_axes=[0], out_of_bounds_policy="pad", fill_value=2.5),
    "pad_saturated": dict(roi_end=[26], roi_axes=[2], out_of_bounds_policy="pad", fill_value=1e6),
    "trim_empty": dict(roi_start=[30], roi_end=[40], roi_axes=[2], out_of_bounds_policy="trim_to_shape"),
}


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("case", list(CASES))
def test_roi_equals_dali(served: tuple[Daemon, dict[str, Path], Dataset], name: str, case: str) -> None:
    d, roots, _ = served
    want = dali_arrays(roots[name], **CASES[case])
    got = ours(d, name, **CASES[case])
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, f"{case} sample {i}: {g.dtype}{g.shape}, DALI {w.dtype}{w.shape}"
        assert np.array_equal(g, w), f"{case} sample {i}: values differ from fn.readers.numpy's"


@pytest.mark.parametrize("backend", ["file", "gds", "bam"])
def test_roi_backends(served: tuple[Daemon, dict[str, Path], Dataset], backend: str) -> None:
    d, roots, raw = served
    need_raw(raw, backend)
    for case in ("start_end", "pad", "one_axis"):
        want = dali_arrays(roots["cube"], **CASES[case])
        got = ours(d, "cube", backend=backend, **CASES[case])
        assert all(np.array_equal(g, w) and g.shape == w.shape for g, w in zip(got, want)), f"{case} on {backend}"


def test_roi_dense_batch(served: tuple[Daemon, dict[str, Path], Dataset]) -> None:
    d, _, _ = served
    with LoaderSource("cube", socket=d.socket, batch_size=N, roi_start=[1, 2, 3], roi_end=[3, 5, 7]) as src:
        batch = next(iter(src))
    assert isinstance(batch, np.ndarray) and batch.shape == (N, 2, 3, 4), "regions of one shape: one (B, *shape) array"


@pytest.mark.parametrize("kw,says", [
    (dict(roi_start=[1], rel_roi_start=[0.5]), "roi_start= and rel_roi_start= are mutually exclusive"),
    (dict(roi_end=[1], roi_shape=[1]), "roi_end= and roi_shape= are mutually exclusive"),
    (dict(roi_start=[1, 2], roi_end=[3]), "different numbers of values"),
    (dict(roi_start=[1], roi_axes=[0, 1]), "roi_axes= has 2 axes, the region arguments 1 values"),
    (dict(roi_start=[1], out_of_bounds_policy="wrap"), "out_of_bounds_policy= must be one of 'error', 'pad', 'trim_to_shape'"),
    (dict(roi_shape=[-1], roi_axes=[0]), "roi_shape= must not be negative"),
    (dict(roi_start=["a"]), "roi_start= must be an int or a list of ints"),
    (dict(rel_roi_end=[float("nan")]), "rel_roi_end= values must be finite"),
])
def test_roi_refused_at_the_call(kw: dict[str, Any], says: str) -> None:
    with pytest.raises((TypeError, ValueError), match=says.replace("(", r"\(").replace("[", r"\[")):
        LoaderSource("cube", socket="/nonexistent/loaderd.sock", **kw)


def test_roi_outside_refused_at_open(served: tuple[Daemon, dict[str, Path], Dataset]) -> None:
    d, _, _ = served
    with pytest.raises(LoaderError, match=r"roi_end|region \[0, 21\) along axis 1 is outside the array's \[0, 20\)"):
        LoaderSource("ragged", socket=d.socket, batch_size=2, roi_end=[21], roi_axes=[1])
    with pytest.raises(LoaderError, match="the array \\(12, 20, 24\\)|has 3 dimensions"):
        LoaderSource("cube", socket=d.socket, batch_size=2, roi_start=[1, 1])
