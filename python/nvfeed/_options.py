# SPDX-License-Identifier: Apache-2.0
"""A source's arguments as one checked structure: ``SourceOptions``,
built and validated once by ``SourceOptions.check`` (every range from
``_args``, whose bounds a Go test ties to the daemon's constants), then
read by the session and the batch views, never checked again."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Sequence, Union, cast

from . import _args
from ._connect import check_timeout, socket_path
from ._cuda import CONTEXT, stream_handle
from ._wds import MissingComponent, ext_arg, missing_arg
from ._wire import ROI, OpenRequest, State

OnError = Literal["raise", "skip"]
Transport = Literal["stream", "http"]
BatchFormat = Literal["numpy", "dali"]
Device = Literal["cpu", "gpu"]
GPUPath = Literal["auto", "cufile", "bounce"]
Shuffle = Literal["permute", "dali"]

_CHOICES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("on_error", ("raise", "skip")), ("transport", ("stream", "http")), ("device", ("cpu", "gpu")),
    ("gpu_path", ("auto", "cufile", "bounce")), ("batch_format", ("numpy", "dali")), ("shuffle", ("permute", "dali")),
)


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    """A ``ValueError`` naming ``name`` and its choices unless ``value`` is one."""
    if value not in allowed:
        said = " or ".join(", ".join(repr(a) for a in allowed).rsplit(", ", 1))
        raise ValueError(f"{name} must be {said}, got {value!r}")


@dataclass(frozen=True)
class SourceOptions:
    """Every argument of a ``LoaderSource`` but the ranks check's, checked.

    Built by ``check`` only: each field is in its range (the daemon's,
    ``_args``) and a literal among its choices. The fields are
    ``LoaderSource``'s parameters of the same names (see there), but
    ``socket`` is resolved (``$NVFEED_SOCKET`` or the default), ``job_id``
    and ``fingerprint`` are ``""`` for none, ``reader_args`` holds the
    reader's arguments as the open request carries them, and ``ext`` is
    ``()`` for a source that names no WebDataset components.

    Attributes
    ----------
    stream : int, str or None
        ``cuda_stream`` as a handle (``"context"`` kept as it is).
    """

    dataset: str
    socket: str
    reader_args: dict[str, object]
    shuffle: Shuffle
    backend: Optional[str]
    backend_options: Optional[dict[str, Any]]
    prefetch_queue_depth: Optional[int]
    release_after: Optional[int]
    state: Optional[State]
    timeout: float
    on_error: OnError
    transport: Transport
    device: Device
    device_id: int
    gpu_path: GPUPath
    reconnect_timeout: float
    batch_format: BatchFormat
    cuda_stream: object = field(compare=False)
    stream: Union[int, str, None]
    job_id: str
    fingerprint: str
    roi: Optional[ROI] = None
    files: tuple[str, ...] = ()
    ext: tuple[str, ...] = ()
    missing_component_behavior: MissingComponent = "empty"
    case_sensitive_extensions: bool = True
    zero_copy: bool = False

    @classmethod
    def check(cls, dataset: str, socket: Optional[str] = None, batch_size: int = 64, shard_id: int = 0,
              num_shards: int = 1, random_shuffle: bool = False, seed: int = 0, pad_last_batch: bool = False,
              stick_to_shard: bool = False, shuffle: Shuffle = "permute", initial_fill: int = 1024,
              backend: Optional[str] = None, backend_options: Optional[dict[str, Any]] = None,
              prefetch_queue_depth: Optional[int] = None, release_after: Optional[int] = None,
              state: Optional[State] = None, timeout: float = 600.0, on_error: OnError = "raise",
              transport: Transport = "stream", device: Device = "cpu", device_id: int = 0,
              gpu_path: GPUPath = "auto", reconnect_timeout: float = 60.0, batch_format: BatchFormat = "numpy",
              cuda_stream: object = None, job_id: Optional[str] = None,
              fingerprint: Optional[str] = None, shuffle_after_epoch: bool = False,
              roi: Optional[ROI] = None,
              shuffle_after_epoch_seed: Optional[int] = None, files: Optional[Sequence[str]] = None,
              file_list: Optional[str] = None, ext: Optional[Any] = None, missing_component_behavior: str = "empty",
              case_sensitive_extensions: bool = True, zero_copy: bool = False) -> SourceOptions:
        """The arguments checked, in ``LoaderSource``'s order.

        Parameters
        ----------
        dataset, socket, batch_size, shard_id, num_shards, random_shuffle, seed, pad_last_batch, stick_to_shard, \
shuffle, initial_fill, backend, backend_options, prefetch_queue_depth, release_after, state, timeout, on_error, \
transport, device, device_id, gpu_path, reconnect_timeout, batch_format, cuda_stream, job_id, fingerprint, \
shuffle_after_epoch, shuffle_after_epoch_seed, files, file_list
            As ``LoaderSource`` takes them, with its defaults.
        roi
            The region of interest its ``fn.readers.numpy`` arguments give
            (``_daliargs.roi``, checked there), or None.
        ext, missing_component_behavior, case_sensitive_extensions, zero_copy
            As ``LoaderSource`` takes them, with its defaults.

        Returns
        -------
        SourceOptions
            The arguments, each in its range.

        Raises
        ------
        ValueError
            An argument out of its range or not among its choices, named
            with its range and the value given.
        TypeError
            ``cuda_stream`` is not a stream, a stream handle or ``"context"``.
        """
        given = {"on_error": on_error, "transport": transport, "device": device, "gpu_path": gpu_path,
                 "batch_format": batch_format, "shuffle": shuffle}
        for name, allowed in _CHOICES:
            _choice(name, given[name], allowed)
        if not isinstance(dataset, str) or not dataset:
            raise ValueError(f"dataset must be a registered dataset's name, got {dataset!r}")
        reader_args = _args.reader_args(batch_size, shard_id, num_shards, random_shuffle, seed, pad_last_batch,
                                        stick_to_shard, initial_fill, shuffle_after_epoch, shuffle_after_epoch_seed)
        if reader_args["shuffle_after_epoch"] and (reader_args["random_shuffle"] or reader_args["stick_to_shard"]):
            raise ValueError("shuffle_after_epoch cannot be true with random_shuffle or stick_to_shard (as in DALI): "
                             "it shuffles the whole list each epoch and keeps each rank's range of it")
        prefetch = _args.optional_int_arg("prefetch_queue_depth", prefetch_queue_depth, 1, _args.MAX_PREFETCH,
                                          "the daemon's default")
        release = _args.optional_int_arg("release_after", release_after, 0, _args.MAX_RELEASE_AFTER,
                                         "derived from the DALI pipeline")
        device_id = _args.int_arg("device_id", device_id, 0, _args.MAX_DEVICE)
        job = _args.job_id_arg(job_id)
        want_fingerprint = _args.fingerprint_arg(fingerprint)
        if cuda_stream is not None and device != "gpu":
            raise ValueError(f"cuda_stream is for device='gpu' (the consumer's GPU work on GPU batches), got it with "
                             f"device={device!r}")
        stream: Union[int, str, None] = CONTEXT if cuda_stream == CONTEXT else stream_handle(cuda_stream)
        if roi is not None and device != "cpu":
            raise ValueError(f"a region of interest (roi_*=) is read into host memory: device='cpu', got "
                             f"device={device!r}")
        exts = () if ext is None else ext_arg(ext)
        missing = missing_arg(missing_component_behavior)
        case = _args.bool_arg("case_sensitive_extensions", case_sensitive_extensions)
        views = _args.bool_arg("zero_copy", zero_copy)
        return cls(dataset=dataset, socket=socket_path(socket), reader_args=reader_args, shuffle=shuffle,
                   backend=backend, backend_options=backend_options, prefetch_queue_depth=prefetch,
                   release_after=release, state=state, timeout=check_timeout("timeout", timeout), on_error=on_error,
                   transport=transport, device=device, device_id=device_id, gpu_path=gpu_path,
                   reconnect_timeout=check_timeout("reconnect_timeout", reconnect_timeout,
                                                   zero="turns reconnection off"),
                   batch_format=batch_format, cuda_stream=cuda_stream, stream=stream, job_id=job,
                   fingerprint=want_fingerprint, roi=roi,
                   files=_args.files_arg(files, file_list), ext=exts, missing_component_behavior=missing,
                   case_sensitive_extensions=case, zero_copy=views)

    def open_request(self) -> OpenRequest:
        """The session's open request (without ``device_uuid``, which
        needs this process's CUDA driver).

        Returns
        -------
        OpenRequest
            The request, optional keys only where given.
        """
        req = cast(OpenRequest, {
            "dataset": self.dataset, **self.reader_args, "shuffle": self.shuffle,
            "memory": "gpu" if self.device == "gpu" else "pinned", "device_id": self.device_id,
            "release_after": self.release_after, "state": self.state,
        })
        if self.job_id:
            req["job_id"] = self.job_id
        if self.fingerprint:
            req["fingerprint"] = self.fingerprint
        if self.files:
            req["files"] = list(self.files)
        if self.backend is not None:
            req["backend"] = self.backend
        if self.backend_options:
            req["backend_options"] = self.backend_options
        if self.prefetch_queue_depth is not None:
            req["prefetch_queue_depth"] = self.prefetch_queue_depth
        if self.device == "gpu":
            req["gpu_path"] = self.gpu_path
        if self.roi is not None:
            req["roi"] = self.roi
        if self.ext:
            req["ext"] = list(self.ext)
            req["missing_component_behavior"] = self.missing_component_behavior
            req["case_sensitive_extensions"] = self.case_sensitive_extensions
        return req
