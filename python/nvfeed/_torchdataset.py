# SPDX-License-Identifier: Apache-2.0
"""``nvfeed.torch.LoaderDataset``: the class, its epochs and positions.
Its pieces: the shard and the last-batch policy (``_torchshard``), what
it yields (``_torchbatch``), batches as tensors (``_torchviews``)."""

from __future__ import annotations

import sys
import warnings
from typing import Any, Iterator, Optional, Union

import torch
import torch.utils.data

from . import _args
from ._options import GPUPath, OnError, Shuffle, SourceOptions, with_parameters
from ._options import SourceOptions as _D  # the defaults, declared once
from ._torchloop import (DATALOADER_WARNING, EpochHook, dataloader_under_lightning, refuse_batching, refuse_worker,
                         torch_device)
from ._torchpasses import STATE_VERSION, Item, Passes, TorchBatch
from ._torchshard import LastBatchPolicy, shard_args
from ._torchviews import TorchViews
from ._wdsmatch import ext_args

__all__ = ["LoaderDataset", "STATE_VERSION", "Item", "TorchBatch"]


class LoaderDataset(torch.utils.data.IterableDataset[Item]):
    """One rank's shard of a dataset registered with loaderd, batch by
    batch, as a PyTorch ``IterableDataset``.

    Iterating it yields one epoch: ``(samples, labels)`` per batch, where
    ``samples`` is a list of 1-D ``torch.uint8`` tensors (each a sample's
    bytes) and ``labels`` an ``int64`` tensor of shape (batch,) on the
    CPU. Over a numpy dataset (``mkbmap --reader numpy``) each batch is
    the arrays alone, no labels: one tensor ``(batch, *shape)`` of the
    dataset's dtype when the batch's arrays share a shape (the daemon
    places them back to back: with ``zero_copy`` the tensor is
    ``torch.from_numpy`` of the batch memory itself, no copy), else a list
    of tensors, each its array's shape (0-d and empty arrays included);
    with ``on_error="skip"`` a batch that lost samples is a list of the
    others. Over a WebDataset dataset (tar shards) name the components
    with ``ext``: each batch is a tuple, one entry per ``ext`` entry, as
    ``webdataset.WebDataset(...).to_tuple(*ext)`` gives a sample's (its
    extensions lower-cased, as there), by batch: each sample's component
    as ``bytes`` (an empty one ``b""``), or with ``decode_labels`` an
    integer entry (``cls``...) as one int64 tensor (batch,).

    **Epochs.** Every rank's loop receives ``len(ds)`` batches an epoch.
    A loop that received them all has finished its epoch, whether or not it
    asked for one more (Lightning stops at ``len``): the next ``iter()``
    starts the next epoch. A training loop that stopped early (``break``,
    or an exception) and iterates again goes on from where it stopped, as a
    resumed run would. An evaluation pass, one begun with autograd off
    (``torch.no_grad()``, ``torch.inference_mode()``: every validation
    loop, Lightning's sanity check, ``trainer.validate``), that stops early
    leaves the position where it found it: the next pass starts where that
    one did, so a sanity check's two batches eat no validation epoch.
    ``set_epoch(e)`` (Lightning calls it, through ``ds.sampler``) starts the
    next pass at epoch e unless already in it: a dataset made anew each
    epoch yields what one would (one that begins an epoch 0 already begun
    in the process warns). The session opens at the first iteration (or
    ``len()``, ``state_dict()``), so the dataset may be made before
    ``init_process_group``.

    **Shards.** Without ``shard_id``/``num_shards`` the shard is this
    process's rank and the world size: from ``torch.distributed`` when it is
    initialised, else from ``RANK``/``WORLD_SIZE`` (``torchrun`` sets
    them), else a single shard. Shards are disjoint and together hold
    every sample once an epoch. ``last_batch_policy`` says what the loop
    receives of a shard's end, as DALI's iterators' ``LastBatchPolicy``
    (computed from the sampling alone, so every rank agrees):
    ``"partial"`` (the default) gives every rank ``ceil(ceil(N/ranks)/
    batch_size)`` batches: no sample twice (``pad_last_batch``'s padding is
    trimmed) and as many steps on every rank, which DDP needs to not wait
    forever on a rank that has finished; a shard's last batch is partial,
    and a rank whose shard is one sample short of filling that many
    batches gets an empty last batch (``[]`` and an empty label tensor),
    as DALI's iterators give. ``"drop"``: only whole batches, as many as
    the smallest shard fills, on every rank (the rest unseen this epoch).
    ``"fill"``: the daemon's batches as read (with ``pad_last_batch``
    whole ones, the last sample repeated; without, ranks may differ by a
    batch).

    **Lightning.** Return the dataset itself from ``train_dataloader()``:
    Lightning saves its ``state_dict()``, so a mid-epoch checkpoint resumes
    exactly. Through a ``DataLoader`` (no ``state_dict()``) a resumed run
    starts the epoch over; the dataset warns of it under Lightning.

    **No DataLoader workers, no second batching.** The daemon reads ahead
    in its own process: iterate the dataset, or ``DataLoader(ds,
    batch_size=None)``. A worker process raises ``RuntimeError``, and a
    DataLoader that would batch the batches again (its default
    ``batch_size=1``) raises ``TypeError`` at its first batch. Decode on
    the GPU or with DALI where decoding must keep up.

    **Lifetime.** By default (``zero_copy=False``) every batch is copied out
    of the daemon's batch memory before it is handed over, and its memory
    goes back to the daemon when the next batch is asked for: the tensors
    are ordinary, writable tensors that stay valid for as long as they are
    referenced, whatever the loop keeps (the samples of one batch share
    one allocation, so a kept sample keeps its batch's copy). The copy
    costs one ``memcpy`` a batch. With ``zero_copy=True`` the sample tensors
    view the daemon's batch memory and are valid **until the next batch is
    asked for** (the next step of the ``for`` loop): after that the daemon
    reuses the memory, so a sample kept longer may change under you; clone
    what must outlive the step. They view read-only memory and are
    ``ReadOnlyTensor``: an in-place op or assignment raises
    ``RuntimeError`` (their views too); ``.clone()`` is writable. Labels are
    always a fresh tensor.

    **GPU.** ``device="cuda"`` (or ``"cuda:N"``) makes the daemon place
    batches in GPU memory on that device; samples are CUDA tensors
    (``torch.as_tensor`` of the client's ``CudaArray``), labels stay on the
    CPU. Copies are device-to-device on the current stream, and the next
    batch is asked for only once they are done. With ``zero_copy=True`` a
    batch goes back to the daemon one request later, once the work queued on
    the current stream before the next request is done, so the loop keeps
    one step of overlap with the GPU; work on other streams that reads the
    samples is yours to finish before the next step. ``torchvision.io.decode_jpeg`` wants its input on the CPU, even
    with ``device="cuda"``: JPEGs for it come from a CPU dataset.

    **Resume.** ``state_dict()`` is the position of the next batch the loop
    will receive (epoch and batch within it) with the sampling it was made
    under; ``load_state_dict()`` on a fresh dataset (same arguments) makes
    its iteration continue with exactly that batch, mid-epoch or at an
    epoch's start, shuffled or not, as MosaicML streaming's datasets do. The
    position is the same on every rank of a loop that steps together, so
    rank 0's ``state_dict()`` resumes every rank (each keeps its own shard).

    Parameters
    ----------
    {dataset}
    {socket}
    {batch_size}
    shard_id : int, optional
        This rank's shard, in ``[0, num_shards)``; by default the rank (see
        Shards). Give both ``shard_id`` and ``num_shards`` or neither.
    num_shards : int, optional
        The number of shards; by default the world size.
    {random_shuffle}
    {seed}
    pad_last_batch : bool, optional, default = False
        The daemon pads every shard to the same number of whole batches by
        repeating its last sample, as DALI's reader does; the loop sees the
        padding only with ``last_batch_policy="fill"``.
    last_batch_policy : {"partial", "drop", "fill"}, optional, default = "partial"
        What the loop receives of a shard's end (see Shards).
    {stick_to_shard}
    {shuffle}
    {initial_fill}
    zero_copy : bool, optional, default = False
        Hand out views of the daemon's batch memory instead of copies; see
        Lifetime for the rule they follow.
    device : str or torch.device, optional, default = "cpu"
        ``"cpu"``, or ``"cuda"``/``"cuda:N"`` for samples in GPU memory.
    gpu_path : {"auto", "cufile", "bounce"}, optional, default = "auto"
        How batches reach GPU memory (see ``LoaderSource``).
    {backend}
    {backend_options}
    {prefetch_queue_depth}
    {timeout}
    {on_error}
    {reconnect_timeout}
    ext, missing_component_behavior, case_sensitive_extensions
        WebDataset: as ``LoaderSource``'s, but ``case_sensitive_extensions=None`` (the default) matches as
        ``webdataset`` does, each member's extension lower-cased (``_wdsmatch``); True/False: DALI's rule.
    decode_labels : bool, optional, default = False
        WebDataset: ``ext`` entries of integer extensions (``cls``,
        ``cls2``, ``class``, ``count``, ``index``, ``inx``, ``id``) as one
        int64 tensor a batch, their text decoded (else bytes). With
        ``zero_copy`` or a GPU the other components are uint8 tensors.

    Raises
    ------
    ValueError
        At once: ``zero_copy`` is not a bool, ``last_batch_policy`` not
        one of its values, ``device`` is not a CPU or CUDA device, only one
        of ``shard_id`` and ``num_shards`` is given, or an argument fails
        ``LoaderSource``'s checks. The daemon's answers come when the
        session opens.
    """

    def __init__(self, dataset: str, socket: Optional[str] = None, batch_size: int = _D.batch_size, *,
                 shard_id: Optional[int] = None, num_shards: Optional[int] = None,
                 random_shuffle: bool = _D.random_shuffle, seed: int = _D.seed,
                 pad_last_batch: bool = _D.pad_last_batch,
                 last_batch_policy: LastBatchPolicy = "partial",
                 stick_to_shard: bool = _D.stick_to_shard, shuffle: Shuffle = _D.shuffle,
                 initial_fill: int = _D.initial_fill, zero_copy: bool = _D.zero_copy,
                 device: Union[str, torch.device] = "cpu", gpu_path: GPUPath = _D.gpu_path,
                 backend: Optional[str] = None, backend_options: Optional[dict[str, Any]] = None,
                 prefetch_queue_depth: Optional[int] = None, timeout: float = _D.timeout,
                 on_error: OnError = _D.on_error, reconnect_timeout: float = _D.reconnect_timeout,
                 ext: Optional[Any] = None, missing_component_behavior: str = _D.missing_component_behavior,
                 case_sensitive_extensions: Optional[bool] = None, decode_labels: bool = False) -> None:
        super().__init__()
        zero_copy = _args.bool_arg("zero_copy", zero_copy)
        shard = shard_args(last_batch_policy, shard_id, num_shards)
        dev = torch_device(device)
        self.dataset = dataset
        self.batch_size = batch_size
        self.zero_copy = zero_copy
        self.decode_labels = _args.bool_arg("decode_labels", decode_labels)
        self.last_batch_policy = last_batch_policy
        self.device = dev
        args: dict[str, Any] = dict(
            socket=socket, batch_size=batch_size, random_shuffle=random_shuffle, seed=seed,
            pad_last_batch=pad_last_batch, stick_to_shard=stick_to_shard, shuffle=shuffle, initial_fill=initial_fill,
            backend=backend, backend_options=backend_options, prefetch_queue_depth=prefetch_queue_depth,
            timeout=timeout, on_error=on_error, reconnect_timeout=reconnect_timeout,
            missing_component_behavior=missing_component_behavior, **ext_args(ext, case_sensitive_extensions),
            # The batch handed out last goes back with the request for the
            # next one: the lifetime rule above, in both modes.
            release_after=0, zero_copy=True)  # the source's views: copied here (TorchViews)
        if dev.type == "cuda":
            # Zero-copy CUDA batches go back one request later, once the GPU
            # work queued on them is done (see _wait_pending): the loop keeps
            # one step of overlap with the GPU, and the rule above holds.
            args.update(device="gpu", device_id=dev.index, gpu_path=gpu_path, release_after=int(zero_copy))
        self._warned_loader = False
        # Checked here, once: the session opens at the first iteration.
        options = SourceOptions.check(dataset, **args)
        self._passes = Passes(dataset, batch_size, last_batch_policy, self.decode_labels, options, shard,
                              TorchViews(dev, zero_copy))
        """The session and the position (``_torchpasses``): state_dict and set_epoch live there."""

    @property
    def shard(self) -> tuple[int, int]:
        """``(shard_id, num_shards)``: as given, else this process's rank and
        world size (``distributed_shard()``)."""
        return self._passes.shard

    @property
    def sampler(self) -> EpochHook:
        """What Lightning calls ``set_epoch`` on at every epoch's start
        (it looks for a loader's ``sampler``): this dataset's
        ``set_epoch``."""
        return EpochHook(self)

    batch_sampler = None
    """No batch sampler: the dataset batches itself (Lightning asks)."""

    def close(self) -> None:
        """Ends the session with the daemon. Tensors handed out stay valid
        (copies), or must no longer be used (``zero_copy``). Iterating again
        opens a new session at the position this one had reached (when the
        daemon could still be asked for it)."""
        self._passes.close()

    def __len__(self) -> int:
        """Batches the loop receives in the next epoch (see Shards: the
        same on every rank, but with ``last_batch_policy="fill"``). In a
        resumed epoch (docs/resume.md), the more of its count and a whole
        epoch's: Lightning asks once and ends every epoch at its end."""
        return self._passes.batches()

    def __iter__(self) -> Iterator[Item]:
        refuse_worker()
        refuse_batching(sys._getframe(1), self)
        if not self._warned_loader and dataloader_under_lightning(sys._getframe(1)):
            self._warned_loader = True
            warnings.warn(DATALOADER_WARNING, UserWarning, stacklevel=2)
        return self._passes.epoch(not torch.is_grad_enabled())

    def set_epoch(self, epoch: int) -> None:
        self._passes.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self._passes.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._passes.load_state_dict(state_dict)

    set_epoch.__doc__ = Passes.set_epoch.__doc__
    state_dict.__doc__ = Passes.state_dict.__doc__
    load_state_dict.__doc__ = Passes.load_state_dict.__doc__


LoaderDataset.__doc__ = with_parameters(LoaderDataset.__doc__ or "")
