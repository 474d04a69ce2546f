# SPDX-License-Identifier: Apache-2.0
"""``nvfeed.dali.reader`` where ``fn.readers.webdataset`` stood: one
output per ``ext`` entry, ``dtypes`` applied as that reader applies them
(each component's bytes reinterpreted), and the reader's place in the
pipeline's sequence of operator seeds kept. Imported by ``nvfeed.dali``,
which loads DALI first."""

from __future__ import annotations

import importlib
from typing import Any, Optional, Sequence

from ._dalireader import Reader, register

_fn: Any = importlib.import_module("nvidia.dali.fn")
_types: Any = importlib.import_module("nvidia.dali.types")


def dtypes_arg(dtypes: object, k: int) -> list[Any]:
    """``fn.readers.webdataset``'s ``dtypes``: one DALI type for every
    output, or one per output (``None``: all ``UINT8``).

    Raises
    ------
    TypeError
        ``dtypes`` is not a DALI type or a list of them, or its length is
        not the number of outputs.
    """
    if dtypes is None:
        return [_types.UINT8] * k
    given: Sequence[object] = dtypes if isinstance(dtypes, (list, tuple)) else [dtypes] * k
    if len(given) != k or not all(isinstance(d, _types.DALIDataType) for d in given):
        raise TypeError(f"nvfeed.dali.reader: dtypes must be a DALI type (nvidia.dali.types.DALIDataType) or one "
                        f"per ext entry ({k}), as fn.readers.webdataset takes it; got {dtypes!r}")
    return list(given)


def outputs(pipe: Any, name: Optional[str], rd: Reader, seed: Optional[int], k: int, dtypes: list[Any],
            keep_seed_slot: bool) -> Any:
    """The reader's outputs over a WebDataset dataset: an external source
    of ``k`` outputs (one ``TensorListCPU`` a component a batch), each
    reinterpreted as its ``dtypes`` entry when not bytes, as
    ``fn.readers.webdataset`` returns them (one ``DataNode`` for one
    ``ext`` entry, else a list). ``keep_seed_slot``: this DALI gives
    seeds only to operators that take one, so without ``seed`` a
    one-value uniform takes the seed the reader would have had (as
    ``nvfeed.dali.reader`` does for ``fn.readers.file``)."""
    outs = list(_fn.external_source(source=rd, num_outputs=k, batch=True, batch_info=True, no_copy=True,
                                    dtype=[_types.UINT8] * k))
    if seed is None and keep_seed_slot:
        one = _fn.random.uniform(values=[1.0], shape=[1])
        rd.marker = one.source
        outs = [_fn.reshape(o, rel_shape=one) for o in outs]
    else:
        rd.marker = outs[0].source
    outs = [o if d == _types.UINT8 else _fn.reinterpret(o, dtype=d) for o, d in zip(outs, dtypes)]
    if name is not None:
        register(pipe, name, rd)
    return outs[0] if k == 1 else outs
