# SPDX-License-Identifier: Apache-2.0
"""A dataset's content across nodes (docs/resume.md, Across nodes): each
node's daemon summarises its own copy by its samples' names, sizes and
labels (``bmap.Content``), whatever its block layout. Ranks compare the
summaries, and a difference is named: the first chunk of samples that
differs, and each side's first sample there. A state carries the
summary where it was taken; the daemon refuses it on a copy that
differs."""

from __future__ import annotations

import json
import warnings
from typing import TYPE_CHECKING, Any, Optional, cast

if TYPE_CHECKING:  # types only: the client's import chain stays short
    from ._wire import Content, OpenRequest, State

FEATURE = "content"
"""The daemon's feature: it gives and checks content."""


CHUNK_HEX = 16
"""Hex digits of a chunk's digest in ``Content["chunks"]``."""


def _first(c: Content, i: int, who: str) -> str:
    """Chunk i's first sample as ``who`` has it, if c names it:
    '; rank 1's first there is "n01/x.JPEG" (12345 bytes, label 3)'."""
    names = c.get("names") or []
    if i >= len(names):
        return ""
    name = json.dumps(names[i], ensure_ascii=False)  # quoted as the daemon quotes it
    size, label = c["sizes"][i], c["first_labels"][i]
    return f"; {who} first there is {name} ({size} bytes{'' if label < 0 else f', label {label}'})"


def describe(mine: Content, other: Content, me: str, them: str) -> str:
    """Where ``mine`` differs from ``other``: sample or label counts, or
    the first chunk of samples that differs and each side's first sample
    there (``bmap.Content.Diff``); ``""`` when they agree. ``me`` and
    ``them`` are possessive: ``"rank 1's"``."""
    if mine["digest"] == other["digest"]:
        return ""
    for what in ("samples", "labels"):
        if mine[what] != other[what]:
            return f"{me} copy has {mine[what]} {what}, {them} {other[what]}"
    k = len(mine["chunks"]) // CHUNK_HEX
    if len(other["chunks"]) == len(mine["chunks"]):
        for i in range(k):
            at = slice(i * CHUNK_HEX, (i + 1) * CHUNK_HEX)
            if mine["chunks"][at] == other["chunks"][at]:
                continue
            lo, hi = i * mine["samples"] // k, (i + 1) * mine["samples"] // k - 1
            where = f"sample {lo} differs" if hi == lo else f"samples {lo}-{hi} differ"
            return where + _first(mine, i, me) + _first(other, i, them)
    return f"{me} copy has digest {mine['digest']}, {them} {other['digest']}"


def differences(dataset: str, gathered: list[dict[str, Any]]) -> list[str]:
    """Each rank whose copy of ``dataset`` differs from the lowest rank's,
    named with the difference. Ranks whose daemon gives no content are
    not compared: a warning says so where other ranks' daemons give one
    (a fleet upgraded in part)."""
    have = [g for g in gathered if g.get("content")]
    if have and len(have) < len(gathered):
        lacking = [g["rank"] for g in gathered if not g.get("content")]
        warnings.warn(f"LoaderSource: the daemons of ranks {lacking} give no content summary of {dataset!r} (a "
                      "loaderd before feature 'content'): the ranks' copies are compared by fingerprint alone, and "
                      "a difference is not named; upgrade loaderd on those nodes", RuntimeWarning, stacklevel=4)
    if not have:
        return []
    ref = have[0]
    out = []
    for g in have[1:]:
        d = describe(g["content"], ref["content"], f"rank {g['rank']}'s", f"rank {ref['rank']}'s")
        if d:
            out.append(f"rank {g['rank']}'s copy of dataset {dataset!r} is not rank {ref['rank']}'s: {d}")
    return out


def fit_state(req: OpenRequest, features: frozenset[str], where: str) -> OpenRequest:
    """``req`` with its state's content left out where the daemon cannot
    check it (no feature ``content``), with a warning; the daemon
    refuses a state's unknown key. ``req`` itself is not changed."""
    st = req.get("state")
    if st is None or "content" not in st:
        return req
    if st.get("content") is not None and FEATURE not in features:
        warnings.warn(f"LoaderSource: loaderd at {where} lacks the feature {FEATURE!r}: it cannot check that its copy "
                      "of the dataset is the one the state was taken on (the samples' names, sizes and labels). "
                      "Resuming unchecked: upgrade loaderd on this node to have it checked", RuntimeWarning,
                      stacklevel=5)
    if FEATURE in features and st.get("content") is not None:
        return req
    out = cast("OpenRequest", dict(req))
    out["state"] = cast("State", {k: v for k, v in st.items() if k != "content"})
    return out


def of(answer: Any) -> Optional[Content]:
    """The content an open answer gives; ``None`` from a daemon that gives none."""
    c = answer.get("content") if isinstance(answer, dict) else None
    return cast("Optional[Content]", c)
