# SPDX-License-Identifier: Apache-2.0
"""``LoaderSource``'s constructor (``_source`` has the class and its
documentation): the DALI reader arguments split off (``_daliargs``: the
region ones kept, performance-only ones ignored, others refused), the
arguments checked once (``SourceOptions``), the session opened (``Feed``),
and a sharded source compared with the other ranks' under
``torch.distributed`` (``_ranks``): a rank whose arguments or open fail
tells the others, rather than leave them waiting."""

from __future__ import annotations

from typing import Any, Optional, Sequence, cast

from . import _args, _daliargs, _ranks
from ._errors import LoaderError
from ._feed import Feed
from ._options import BatchFormat, Device, GPUPath, OnError, Shuffle, SourceOptions, Transport
from ._wire import State


class SourceInit(Feed):
    """A ``Feed`` made from ``LoaderSource``'s arguments (its signature:
    ``inspect.signature(LoaderSource)`` is this ``__init__``'s)."""

    def __init__(self, dataset: str, socket: Optional[str] = None, batch_size: int = 64,
                 shard_id: int = 0, num_shards: int = 1, random_shuffle: bool = False, seed: int = 0,
                 pad_last_batch: bool = False, stick_to_shard: bool = False, shuffle: Shuffle = "permute",
                 initial_fill: int = 1024, backend: Optional[str] = None,
                 backend_options: Optional[dict[str, Any]] = None,
                 prefetch_queue_depth: Optional[int] = None, release_after: Optional[int] = None,
                 state: Optional[State] = None, timeout: float = 600.0, on_error: OnError = "raise",
                 transport: Transport = "stream", device: Device = "cpu", device_id: int = 0,
                 gpu_path: GPUPath = "auto", reconnect_timeout: float = 60.0,
                 batch_format: BatchFormat = "numpy", cuda_stream: object = None, job_id: Optional[str] = None,
                 fingerprint: Optional[str] = None, process_group: Any = None, check_ranks: bool = True,
                 shuffle_after_epoch: bool = False, shuffle_after_epoch_seed: Optional[int] = None,
                 files: Optional[Sequence[str]] = None, file_list: Optional[str] = None, ext: Optional[Any] = None,
                 missing_component_behavior: str = "empty", case_sensitive_extensions: bool = True,
                 zero_copy: bool = False, **dali_args: Any) -> None:
        region = _daliargs.split("LoaderSource", dali_args)
        # A sharded source under torch.distributed is compared with the
        # other ranks' (one collective each): a rank whose arguments or
        # open fail tells them so, rather than leave them waiting.
        peers = _ranks.peers(num_shards, process_group, _args.bool_arg("check_ranks", check_ranks))
        try:
            self.options = SourceOptions.check(
                dataset, socket, batch_size, shard_id, num_shards, random_shuffle, seed, pad_last_batch, stick_to_shard,
                shuffle, initial_fill, backend, backend_options, prefetch_queue_depth, release_after, state, timeout,
                on_error, transport, device, device_id, gpu_path, reconnect_timeout, batch_format, cuda_stream, job_id,
                fingerprint, shuffle_after_epoch, region, shuffle_after_epoch_seed, files, file_list, ext,
                missing_component_behavior, case_sensitive_extensions, zero_copy)
            """The arguments, checked (``SourceOptions``)."""
            super().__init__(self.options)
        except Exception as e:
            if peers is not None:
                peers.fail(e)
            raise
        if peers is not None:
            try:
                peers.compare(dataset, self.fingerprint, self._req["shard_id"], cast(dict[str, Any], self._req), self.content)
            except LoaderError:
                self.close()
                raise
