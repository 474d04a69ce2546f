# SPDX-License-Identifier: Apache-2.0
"""``nvfeed.dali.reader`` where ``fn.readers.numpy`` stood: the dataset's
dtype as DALI's type, and one output, the arrays, in the reader's place in
the pipeline's sequence of operator seeds. Imported by ``nvfeed.dali``,
which loads DALI first."""

from __future__ import annotations

import importlib
from typing import Any, Optional

from ._dalireader import Reader, register

_fn: Any = importlib.import_module("nvidia.dali.fn")
_types: Any = importlib.import_module("nvidia.dali.types")

DALI_TYPES = {"|b1": "BOOL", "|i1": "INT8", "<i2": "INT16", "<i4": "INT32", "<i8": "INT64", "|u1": "UINT8",
              "<u2": "UINT16", "<u4": "UINT32", "<u8": "UINT64", "<f2": "FLOAT16", "<f4": "FLOAT", "<f8": "FLOAT64"}
"""DALI's type of each .npy descr the daemon serves (complex has none)."""


def dali_type(dataset: str, descr: str) -> Any:
    """DALI's type for a numpy dataset's dtype."""
    name = DALI_TYPES.get(descr)
    if name is None:
        raise TypeError(f"nvfeed.dali.reader: numpy dataset {dataset!r} holds arrays of dtype {descr or 'unknown'}, "
                        "for which DALI has no type (as fn.readers.numpy has none)")
    return getattr(_types, name)


def output(pipe: Any, name: Optional[str], rd: Reader, seed: Optional[int], dtype: Any,
           slot_per_seeded_op: bool) -> Any:
    """The one output of a reader over a numpy dataset: an external source
    of the arrays (one TensorListCPU a batch), in fn.readers.numpy's place
    in the pipeline's sequence of operator seeds as reader does it for
    fn.readers.file (where this DALI gives seeds only to operators that
    take one: ``slot_per_seeded_op``)."""
    data = _fn.external_source(source=rd, batch=True, batch_info=True, no_copy=True, dtype=dtype)
    if seed is None and slot_per_seeded_op:
        # As for the two outputs of fn.readers.file: a one-value uniform
        # right after the source takes the seed the reader would have. Its
        # pass-through here is a reshape of the arrays to their own shapes
        # times one: any number of dimensions, 0-d arrays included.
        one = _fn.random.uniform(values=[1.0], shape=[1])
        rd.marker = one.source
        shape = data.shape() if callable(getattr(data, "shape", None)) else _fn.shapes(data)
        data = _fn.reshape(data, shape=shape * _fn.cast(one, dtype=_types.INT64))
    else:
        rd.marker = data.source
    if name is not None:
        register(pipe, name, rd)
    return data

