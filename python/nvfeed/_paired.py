# SPDX-License-Identifier: Apache-2.0
"""``PairedSource``: datasets whose samples pair up (the ``x`` and ``y``
of each case, two maps of one folder) read as one source of aligned
tuples. It owns one ``LoaderSource`` a dataset, all opened with the same
sampling; every step it takes one batch of each, checks that they are
the same batch (epoch, iteration) of the same samples (indices), and
ends every part's epoch at once."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ._errors import DriftError
from ._source import LoaderSource
from ._wire import State


class PairedSource:
    """Several datasets read together, batch by batch, as tuples: for
    ``x, y`` in ``PairedSource(["x", "y"], ...)`` ``x[i]`` and ``y[i]``
    are sample *i* of the same position in both datasets' lists (the
    same case, when each is a map of one folder with its own
    ``--file-filter``: ``fn.readers.numpy`` sorts both lists by name).
    Each part is a ``LoaderSource`` with the same arguments, so the same
    sampling (shuffle, seed, shards, padding) draws the same positions
    from lists of one length. Every step checks that each part returned
    the same batch of the same epoch and the same sample indices, and
    every epoch ends for all the parts together; anything else raises
    ``DriftError`` rather than yield a tuple that does not pair.

    The names themselves are not compared (the daemon sends indices, not
    names): a case missing one of its files makes the lists' lengths
    differ, which the open refuses, but two folders whose names differ
    at equal counts would pair by position.

    Parameters
    ----------
    datasets : sequence of str
        The datasets, as registered with ``loaderd serve --dataset``, at
        least two: each tuple holds their batches in this order.
    state : sequence of State, optional
        Resume where ``state()`` was taken: one state a dataset.
    **source_args
        ``LoaderSource``'s other arguments (``socket``, ``batch_size``,
        ``shard_id``, ``num_shards``, ``random_shuffle``, ``seed``,
        ``zero_copy`` ...), the same for every dataset.

    Raises
    ------
    ValueError
        Fewer than two datasets, ``state`` not one a dataset, or
        ``on_error="skip"`` or ``missing_component_behavior="skip"``: a
        sample left out of one part would shift every later pair.
    DriftError
        The datasets' lists differ in length, or their readers differ.
    LoaderError
        Or a subclass: opening a part failed (the others are closed).
    """

    def __init__(self, datasets: Sequence[str], state: Optional[Sequence[State]] = None, **source_args: Any) -> None:
        names = [datasets] if isinstance(datasets, str) else list(datasets)
        if len(names) < 2:
            raise ValueError(f"PairedSource reads two datasets or more together, got {names!r}")
        for arg in ("on_error", "missing_component_behavior"):
            if source_args.get(arg) == "skip":
                raise ValueError(f"PairedSource: {arg}='skip' would leave a sample out of one part and not its twin, "
                                 "and every later tuple would pair a sample with another case's: leave it at its "
                                 "default, which raises (or gives an empty component) instead")
        states = list(state) if state is not None else [None] * len(names)
        if len(states) != len(names):
            raise ValueError(f"PairedSource: state must be one State a dataset ({len(names)}), got {len(states)}")
        self.parts: list[LoaderSource] = []
        """The sources, one a dataset, in ``datasets``' order."""
        try:
            for name, st in zip(names, states):
                self.parts.append(LoaderSource(name, state=st, **source_args))
            self._check_lists()
        except BaseException:
            self.close()
            raise

    def _check_lists(self) -> None:
        """DriftError unless every part's list is as long as the first's
        and of the same reader."""
        first = self.parts[0]
        n0 = first.opened_state["sampling"]["n"]
        for p in self.parts[1:]:
            n = p.opened_state["sampling"]["n"]
            if n != n0 or p.reader != first.reader:
                raise DriftError(f"PairedSource: dataset {p.options.dataset!r} holds {n} {p.reader} samples, "
                                 f"{first.options.dataset!r} {n0} {first.reader} ones: their samples cannot pair "
                                 "(a case lacks one of its files?)")

    def __iter__(self) -> PairedSource:
        for p in self.parts:
            iter(p)
        return self

    def __next__(self) -> tuple[Any, ...]:
        batches, ended = [], []
        for p in self.parts:
            try:
                batches.append(next(p))
            except StopIteration:
                ended.append(p.options.dataset)
        if ended:
            if len(ended) == len(self.parts):
                raise StopIteration
            raise DriftError(f"PairedSource: the epoch ended for {ended} but not for the other datasets: their "
                             "samples no longer pair")
        first = self.parts[0]
        for p in self.parts[1:]:
            if p.position != first.position or p.last_indices != first.last_indices:
                raise DriftError(f"PairedSource: {p.options.dataset!r} returned epoch/batch {p.position} of samples "
                                 f"{p.last_indices}, {first.options.dataset!r} {first.position} of {first.last_indices}")
        return tuple(batches)

    def __len__(self) -> int:
        """Batches in the current epoch (the same for every part)."""
        return len(self.parts[0])

    def state(self) -> list[State]:
        """Where the parts stand: for ``PairedSource(state=...)``.

        Returns
        -------
        list of State
            One a dataset, in order.
        """
        return [p.state() for p in self.parts]

    def close(self) -> None:
        """Closes every part."""
        for p in self.parts:
            p.close()

    def __enter__(self) -> PairedSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
