# SPDX-License-Identifier: Apache-2.0
"""The protocol's versions (docs/protocol.md, Versions): what this client
tells loaderd with every request (its protocol and release), what it
learns of the daemon from every answer (its protocol, release and
features), and an open request fitted to the daemon it goes to: a key of
a feature the daemon lacks is left out where its value is the default,
and refused naming both versions where it is not."""

from __future__ import annotations

from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any, Optional, cast

from . import _content
from ._errors import LoaderError, VersionError
from ._wire import OpenRequest

PROTOCOL = 3
"""This client's protocol (``wire.Protocol`` in the daemon that came with
it): one more whenever a request or answer changes in a way the other
side must know of."""

OLDEST_DAEMON = 1
"""The oldest daemon protocol this client talks to: protocol 1 is the
release before versions were exchanged, which names none."""

UNVERSIONED = 1
"""The protocol of a daemon whose answers name none."""

RELEASE = (Path(__file__).parent / "VERSION").read_text().strip()
"""This client's release (``nvfeed.__version__``)."""

PROTOCOL_HEADER, RELEASE_HEADER, FEATURES_HEADER = "Nvfeed-Protocol", "Nvfeed-Release", "Nvfeed-Features"

UNVERSIONED_FEATURES = frozenset(("file", "numpy", "webdataset", "roi", "files", "shuffle_after_epoch", "device_uuid",
                                  "stream"))
"""What a daemon of protocol 1 (no version named) serves: every feature
but those that came later."""

FIELD_FEATURES = {
    "ext": "webdataset", "missing_component_behavior": "webdataset", "case_sensitive_extensions": "webdataset",
    "roi": "roi", "files": "files", "shuffle_after_epoch": "shuffle_after_epoch",
    "shuffle_after_epoch_seed": "shuffle_after_epoch", "device_uuid": "device_uuid",
}
"""An open request's keys and the feature each needs (``wire.FieldFeatures``;
a Go test keeps the two equal)."""

_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "ext": ([],), "missing_component_behavior": ("", "empty"), "case_sensitive_extensions": (None, True),
    "roi": (None,), "files": ([],), "shuffle_after_epoch": (False,), "shuffle_after_epoch_seed": (None,),
    "device_uuid": ("",),
}
"""The values of FIELD_FEATURES' keys that mean what their absence does:
left out for a daemon that lacks the feature."""

CLIENT = f"nvfeed {RELEASE} (protocol {PROTOCOL})"
"""This client, as errors name it."""


def request_headers() -> dict[str, str]:
    """The headers every request carries: this client's protocol and
    release."""
    return {PROTOCOL_HEADER: str(PROTOCOL), RELEASE_HEADER: RELEASE}


@dataclass(frozen=True)
class DaemonVersion:
    """A daemon's version, as its answers' headers tell it."""

    protocol: int
    """Its protocol: 1 for a daemon that names none."""
    release: str
    """Its release (loaderd's version); ``""`` when it names none."""
    features: frozenset[str]
    """What it serves that a request may need (``"webdataset"``, ``"roi"``, ...)."""

    def __str__(self) -> str:
        if not self.release:
            return (f"loaderd of protocol {self.protocol} (it sends no version: the release before versions were "
                    "exchanged)")
        return f"loaderd {self.release} (protocol {self.protocol})"


def daemon_of(headers: Message) -> Optional[DaemonVersion]:
    """The daemon's version from an answer's headers; ``None`` when they
    name no protocol (the release before versions, or not loaderd)."""
    p = headers.get(PROTOCOL_HEADER)
    if p is None:
        return None
    try:
        protocol = int(p)
    except ValueError:
        protocol = 0
    features = frozenset(f.strip() for f in (headers.get(FEATURES_HEADER) or "").split(",") if f.strip())
    return DaemonVersion(protocol, headers.get(RELEASE_HEADER) or "?", features)


def unversioned() -> DaemonVersion:
    """A daemon of the release before versions (its answers name none)."""
    return DaemonVersion(UNVERSIONED, "", UNVERSIONED_FEATURES)


def fit(req: OpenRequest, daemon: DaemonVersion, where: str) -> OpenRequest:
    """``req`` as ``daemon`` can take it: each key whose feature it lacks
    left out where its value is the default.

    Parameters
    ----------
    req : OpenRequest
        The open request.
    daemon : DaemonVersion
        The daemon it goes to.
    where : str
        Its socket, for errors.

    Returns
    -------
    OpenRequest
        A copy of ``req``.

    Raises
    ------
    VersionError
        The daemon is older than ``OLDEST_DAEMON``, or lacks the feature
        of a key whose value is not the default: the message names both
        versions and says to upgrade loaderd.
    """
    if daemon.protocol < OLDEST_DAEMON:
        raise VersionError(f"loaderd at {where} is {daemon}, older than the oldest this client, {CLIENT}, talks to "
                           f"(protocol {OLDEST_DAEMON}): upgrade loaderd on this node", 400, "version")
    out = cast(dict[str, Any], dict(req))
    for key, feature in FIELD_FEATURES.items():
        if key not in out or feature in daemon.features:
            continue
        if out[key] not in _DEFAULTS[key]:
            raise VersionError(f"loaderd at {where} is {daemon}, which lacks the feature {feature!r} that "
                               f"{key}={out[key]!r} needs (this client: {CLIENT}): upgrade loaderd on this node to "
                               f"a release that lists {feature!r} in its {FEATURES_HEADER} (nvfeed's own release, "
                               f"{RELEASE}, does), or leave out {key}", 400, "version")
        del out[key]
    return _fit_stages(_content.fit_state(cast(OpenRequest, out), daemon.features, where), daemon, where)


STAGES = "stages"
"""The feature of a resumed state's ``stages`` (state version 3)."""


def _fit_stages(req: OpenRequest, daemon: DaemonVersion, where: str) -> OpenRequest:
    """``req`` for a daemon without feature ``stages``. A whole epoch's
    state goes as version 2, whose layout it has. A resumed state (its
    stages) is refused: that daemon would read it as a whole epoch."""
    st = req.get("state")
    if st is None or STAGES in daemon.features or st.get("version") != 3:
        return req
    if st.get("stages"):
        raise VersionError(f"loaderd at {where} is {daemon}: it does not know the key 'stages' that a resume on "
                           f"other ranks or another batch size needs (this client: {CLIENT}). Upgrade loaderd on "
                           f"this node to a release that lists {STAGES!r} in its {FEATURES_HEADER}", 400, "version")
    out = cast(dict[str, Any], dict(req))
    out["state"] = {k: v for k, v in dict(st, version=2).items() if k != "stages"}  # none, or an empty list
    return cast(OpenRequest, out)


def refused(e: LoaderError, daemon: DaemonVersion, where: str) -> LoaderError:
    """The error for an open request ``daemon`` refused: a key a daemon
    that names no version does not know means it is older than the
    oldest this client talks to (a ``VersionError`` saying so); any
    other refusal is ``e``."""
    mark = 'unknown field "'
    msg = str(e)
    if daemon.release or e.status != 400 or mark not in msg:
        return e
    key = msg.split(mark, 1)[1].split('"', 1)[0]
    return VersionError(f"loaderd at {where} does not know the key {key!r} that this client, {CLIENT}, sent, and names "
                        f"no protocol version: it is older than protocol {OLDEST_DAEMON}, the oldest this client talks "
                        "to. Upgrade loaderd on this node (its package, or its DaemonSet's image), or run a client as "
                        f"old as it. The daemon said: {msg}", 400, "version")
