# SPDX-License-Identifier: Apache-2.0
"""The DALI-facing source: the iterator protocol, ``batch(info)`` for
checkpointing, the ``samples``/``labels`` halves for two external
sources, failed samples raised or skipped, and ``release_after`` fitted
to the DALI pipeline fed. Batches come from the session (``_session``)
and are made by the batch views (``_views``)."""

from __future__ import annotations

import warnings
from typing import Any, Optional, Union, cast

import numpy as np

from . import _depth, _views, _wds
from ._errors import DriftError, LoaderError, SampleError
from ._lifetime import Lifetime, own
from ._options import SourceOptions
from ._pair import BatchHalves, Position, batch_position
from ._session import Session
from ._views import Batch, DaliBatch, DaliTypes, Tensors
from ._wds import Components
from ._wdsskip import tell
from ._wire import NextResponse


class Feed(Session):
    """A session's batches as DALI's ``fn.external_source`` takes them."""

    def __init__(self, o: SourceOptions) -> None:
        self._dtypes: dict[str, np.dtype[Any]] = {}  # a numpy dataset's dtype by descr
        self._halves = BatchHalves()
        self._last: Optional[Position] = None  # the position of the batch returned last
        self.last_indices: list[int] = []
        """The dataset's sample indices of the batch returned last, in order."""
        self._lifetime = Lifetime(o.zero_copy)  # views or copies
        self._release_after_given = o.release_after is not None
        self._dali_looked = False  # the DALI pipeline fed was looked for (release_after)
        self.keep: Optional[int] = None
        """Hand out only the first ``keep`` samples of the next batch (the
        rest is padding: ``nvfeed.torch``'s last-batch policy); ``None``: all."""
        super().__init__(o, DaliTypes() if o.batch_format == "dali" else None)

    def __iter__(self) -> Feed:
        # DALI calls iter() on an iterable source while it builds the
        # pipeline's graph: the pipeline is current then.
        self._fit_pipeline(frames=False)
        if self._last is not None and self._expect == (self._last[0], self._epoch_batches) and self._epoch_batches:
            raise DriftError(f"LoaderSource({self._req['dataset']!r}) iterated anew with every batch of epoch "
                             f"{self._last[0]} taken but not its end: this pass would be that end alone. zip() of two "
                             "sources leaves the second there when the first ends, and from then on pairs a batch "
                             "with its twin's predecessor; read datasets that pair with nvfeed.PairedSource, or take "
                             "the end with one more next() (StopIteration)")
        return self

    def _fit_pipeline(self, frames: bool) -> None:
        """Makes release_after cover the DALI pipeline this source feeds
        (_depth), once: the session is reopened at this source's position
        with a larger one when it was not given, a ValueError raised when
        the one given is too small."""
        if self._dali_looked:
            return
        pipe = _depth.find_pipeline(frames)
        if pipe is None:
            self._dali_looked = frames  # iter() outside DALI: look again at the first batch
            return
        self._dali_looked = self._lifetime.dali = True
        n = _depth.release_after_for(pipe, self._release_after, self._req["release_after"] if self._release_after_given else None)
        if n is not None and self._id is not None and self._expect is not None:
            self._reopen(n)

    @property
    def zero_copy(self) -> bool:
        """Batches read outside DALI view the batch memory (see ``LoaderSource``)."""
        return self._lifetime.zero_copy

    @property
    def position(self) -> Optional[Position]:
        """(epoch, iteration) of the batch returned last; None before the first."""
        return self._last

    def __next__(self) -> Union[Batch, DaliBatch, Tensors, Components]:
        return self._fetch(None)

    def batch(self, info: Any) -> Union[Batch, DaliBatch, Tensors, Components]:
        """Batch ``info.iteration`` of epoch ``info.epoch_idx``: for
        ``fn.external_source(source=src.batch, batch=True, batch_info=True)``,
        which gives DALI's ``BatchInfo``. Raises ``StopIteration`` past the
        epoch's last batch. As the batch is a pure function of (epoch,
        iteration), a pipeline built with ``enable_checkpointing=True``
        resumes exactly from ``pipe.checkpoint()``: DALI asks again for the
        batches it had prefetched. Asking in order costs no extra read.
        (Pass the bound method: DALI iterates any iterable source and ignores
        ``batch_info`` for it.)

        Parameters
        ----------
        info : nvidia.dali.types.BatchInfo
            The batch DALI asks for (``epoch_idx``, ``iteration``).

        Returns
        -------
        Batch, DaliBatch, Tensors or Components
            The batch, as ``next()`` gives it.
        """
        return self._fetch((int(info.epoch_idx), int(info.iteration)))

    def _fetch(self, at: Optional[tuple[int, int]]) -> Union[Batch, DaliBatch, Tensors, Components]:
        if self._id is None:
            raise LoaderError("LoaderSource is closed")
        if not self._dali_looked:
            self._fit_pipeline(frames=True)  # a callable source (src.batch): DALI is among the callers
        copy = self._lifetime.copies(self._gpu is not None, self._req["dataset"])
        r = self._deliver(at)
        self._epoch_batches = r["epoch_batches"]
        if r["end_of_epoch"]:
            self._expect = (r["epoch"], 0)
            raise StopIteration
        if self.keep is not None and self.keep < _wds.count_samples(self.components, r["offsets"]):
            r = _views.prefix(r, self.keep, self.components or 1)
        if at is not None and (r["epoch"], r["iteration"]) != at:
            self._drop_stream()
            raise LoaderError(f"loaderd: sent epoch {r['epoch']} batch {r['iteration']}, asked for {at}")
        self._expect = (r["epoch"], r["iteration"] + 1)
        self._last = (r["epoch"], r["iteration"])
        if self.skipped_at_open[0] and r["iteration"] == 0 and r["epoch"] != self._skip_told:
            self._skip_told = r["epoch"]
            tell(self._req["dataset"], r["epoch"], self._req.get("ext") or [], self.skipped_at_open)
        failed = r.get("failed") or []
        if failed and (self._on_error == "raise" or len(failed) == _wds.count_samples(self.components, r["offsets"])):
            self._give_back.append(r["slot"])
            raise SampleError(r["epoch"], r["iteration"], failed, r.get("errors") or [])
        self.last_indices = r.get("indices") or []
        m = self._mapped
        if copy:  # the batch's own memory: its slot goes back with the next request
            m, r = own(m, r)
            self._give_back.append(r["slot"])
        else:
            self._held.append(r["slot"])
        if self.components:
            keep = self._skip(r, failed) if failed else None
            return _wds.outputs(m, self.components, r["offsets"], r["lengths"], keep)
        offsets, lengths, lbls = r["offsets"], r["lengths"], r["labels"]
        if self.reader == "numpy":
            return self._tensors(m, r, failed)
        if not failed:  # the common case: every sample, no index juggling
            return _views.batch(m, offsets, lengths, np.array(lbls, dtype=np.int32).reshape(-1, 1))
        keep = self._skip(r, failed)
        labels = np.asarray([lbls[i] for i in keep], dtype=np.int32).reshape(-1, 1)
        return _views.batch(m, [offsets[i] for i in keep], [lengths[i] for i in keep], labels)

    def _skip(self, r: NextResponse, failed: list[int], stacklevel: int = 4) -> list[int]:
        """The positions of the samples that were read (on_error="skip"),
        the failed ones counted and warned of (the warning points
        stacklevel frames up: at the caller of next())."""
        bad = set(failed)
        keep = [i for i in range(_wds.count_samples(self.components, r["offsets"])) if i not in bad]
        self.skipped_samples += len(failed)
        warnings.warn(f"LoaderSource: epoch {r['epoch']} batch {r['iteration']}: skipped {len(failed)} sample(s) "
                      "that could not be read: " + "; ".join(r.get("errors") or []), RuntimeWarning, stacklevel=stacklevel)
        return keep

    def _tensors(self, m: _views.Mapped, r: NextResponse, failed: list[int]) -> Union[Tensors, Any]:
        """A numpy dataset's batch (``_views.tensors``) in the memory ``m``
        (the session's, or the batch's copy), its failed samples skipped."""
        descr, shapes = r.get("dtype"), r.get("shapes")
        offsets, lengths = r["offsets"], r["lengths"]
        if descr is None or shapes is None or len(shapes) != len(offsets):
            raise LoaderError(f"loaderd: epoch {r['epoch']} batch {r['iteration']} of numpy dataset "
                              f"{self._req['dataset']} came without a dtype and one shape per sample")
        dt = self._dtypes.get(descr)
        if dt is None:
            dt = self._dtypes[descr] = _views.tensor_dtype(descr)
        if failed:
            keep = self._skip(r, failed, stacklevel=5)
            offsets, lengths, shapes = [offsets[i] for i in keep], [lengths[i] for i in keep], [shapes[i] for i in keep]
        return _views.tensors(m, f"epoch {r['epoch']} batch {r['iteration']}", dt, offsets, lengths,
                              shapes, whole=not failed, dataset=self._req["dataset"])

    def samples(self, info: Any = None) -> Any:
        """The samples of the next batch (or of batch ``info`` of DALI's
        ``BatchInfo``), in this source's batch_format, for one
        ``fn.external_source`` while ``labels`` feeds another: every
        output of one external source lives on its device, so GPU samples
        and host labels need two. DALI calls the two once each per
        iteration, in no defined order: whichever comes first fetches the
        batch, the other takes its half of the same batch (the end of an
        epoch too). Asking for one half twice before the other was taken
        raises ``LoaderError`` (never a shifted label). Use both or
        neither, ``parallel=False``::

            src = LoaderSource("imagenet", batch_size=64, device="gpu", batch_format="dali")

            @pipeline_def(batch_size=64, num_threads=4, device_id=0)
            def pipe():
                data = fn.external_source(source=src.samples, batch=True, device="gpu", no_copy=True,
                                          dtype=types.UINT8)
                labels = fn.external_source(source=src.labels, batch=True, device="cpu",
                                            dtype=types.INT32)
                return data, labels

        For checkpointing pass ``batch_info=True`` to both: each then gets
        DALI's ``BatchInfo`` and the batch at that position (see
        ``batch``).

        A numpy or WebDataset dataset has no labels: ``samples`` is then the
        whole batch (the arrays, or the components), the next one at every call (or the one ``info``
        names), as ``next()`` and ``batch`` give it, for one external
        source; ``labels`` raises.

        Parameters
        ----------
        info : BatchInfo or int, optional
            DALI's ``BatchInfo`` (``batch_info=True``), or nothing (or
            the iteration number DALI passes) for the next batch.

        Returns
        -------
        Any
            The samples, in this source's batch_format.
        """
        if self.reader == "numpy" or self.components:
            return self._fetch(batch_position(info))
        return self._halves.take(0, info, self._fetch_half)

    def labels(self, info: Any = None) -> Any:
        """The labels (int32, shape (1,) a sample; a ``TensorListCPU`` with
        ``batch_format="dali"``, else a numpy array of shape (batch, 1)) of
        the batch whose samples ``samples`` hands out, for a second
        ``fn.external_source(source=src.labels, device="cpu")``; see
        ``samples``. A numpy dataset has none: ``LoaderError``.

        Parameters
        ----------
        info : BatchInfo or int, optional
            As ``samples`` takes it.

        Returns
        -------
        Any
            The labels, in this source's batch_format.
        """
        if self.reader == "numpy" or self.components:
            what = "WebDataset samples (a label is a component: name its ext)" if self.components else "numpy arrays"
            raise LoaderError(f"LoaderSource: dataset {self._req['dataset']} holds {what}, without labels: feed "
                              "the source itself (or src.samples) to one fn.external_source")
        return self._halves.take(1, info, self._fetch_half)

    def _fetch_half(self, at: Optional[Position]) -> tuple[Position, Any, Any]:
        samples, labels = cast(tuple[Any, Any], self._fetch(at))
        return cast(Position, self._last), samples, labels

    def _closed(self) -> None:
        self._halves.clear()
