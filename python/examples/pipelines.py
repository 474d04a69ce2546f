# SPDX-License-Identifier: Apache-2.0
"""The four pipelines of the xNVMe DALI example, with this project's
sources: fn.readers.file, and fn.external_source over LoaderSource with the
file, gds and bam backends. Each decodes JPEGs on the CPU (device_id=None)
or on the GPU when one is given."""

from __future__ import annotations

import nvidia.dali.fn as fn
import nvidia.dali.types as types
from nvidia.dali import pipeline_def

from nvfeed import LoaderSource


def file_reader_pipeline(datadir: str, batch_size: int, device_id: int | None = None, shuffle: bool = True):
    """DALI's own reader."""
    @pipeline_def(batch_size=batch_size, num_threads=4, device_id=device_id)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=datadir, random_shuffle=shuffle, name="Reader")
        images = fn.decoders.image(jpegs, device="mixed" if device_id is not None else "cpu")
        return images, labels
    return pipe()


def loader_pipeline(dataset: str, socket: str, backend: str, batch_size: int, device_id: int | None = None,
                    shuffle: bool = True, shard_id: int = 0, num_shards: int = 1):
    """The same pipeline fed by loaderd through LoaderSource (backend file, gds or bam)."""
    src = LoaderSource(dataset, socket=socket, batch_size=batch_size, shard_id=shard_id, num_shards=num_shards,
                       random_shuffle=shuffle, seed=0, backend=backend, prefetch_queue_depth=2)

    @pipeline_def(batch_size=batch_size, num_threads=4, device_id=device_id, prefetch_queue_depth=2)
    def pipe():
        jpegs, labels = fn.external_source(source=src, num_outputs=2, batch=True, no_copy=True,
                                           dtype=[types.UINT8, types.INT32])
        images = fn.decoders.image(jpegs, device="mixed" if device_id is not None else "cpu")
        return images, labels
    return pipe(), src
