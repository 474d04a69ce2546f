# SPDX-License-Identifier: Apache-2.0
"""The client's exceptions: ``LoaderError`` and a subclass per kind of
answer from loaderd, or per way of not reaching it."""

from __future__ import annotations

from typing import Optional


class LoaderError(RuntimeError):
    """An error reported by loaderd, or the daemon could not be reached.

    ``status`` is the daemon's HTTP status (``None`` when there was no
    answer), ``error_code`` its machine-readable error code (``"rank_mismatch"``,
    ``"not_found"``, ...; ``None`` when it gave none). Its subclasses mirror
    the daemon's error kinds, so a caller can branch on the class instead
    of parsing the message."""

    status: Optional[int] = None
    error_code: Optional[str] = None

    def __init__(self, msg: str, status: Optional[int] = None, error_code: Optional[str] = None) -> None:
        super().__init__(msg)
        if status is not None:
            self.status = status
        if error_code:
            self.error_code = error_code


class DriftError(LoaderError):
    """Sources read together went out of step: the parts of a
    ``PairedSource`` are not at the same batch or sample, or end their
    epochs apart; or a ``LoaderSource`` is iterated anew with every batch
    of its epoch taken but not its end, as ``zip`` of two sources leaves
    the second (its next pass would be that end alone, then a step
    behind its twin)."""


class BadRequestError(LoaderError):
    """An argument out of range, an unknown backend or option (HTTP 400)."""
    status = 400


class ForbiddenError(LoaderError):
    """This user may not read the dataset through the filesystem, or the
    session belongs to another user (HTTP 403)."""
    status = 403


class NotFoundError(LoaderError):
    """Unknown dataset, or a session closed or reaped (HTTP 404)."""
    status = 404


class ConflictError(LoaderError):
    """Every batch slot is held, or the dataset's map is stale or its
    device unreadable (HTTP 409)."""
    status = 409


class RankMismatchError(ConflictError):
    """The ranks of one training job disagree: another seed, ``num_shards``,
    batch size, shuffle, dataset (fingerprint), or one ``shard_id`` on two
    ranks; or a node's copy of the dataset is not the others' (its samples'
    names, sizes or labels), or not the one a resumed state was taken on.
    Raised by the daemon for the sessions of a ``job_id`` on its node and
    for a state whose content is not its copy's (HTTP 409, code
    ``"rank_mismatch"``), and on every rank when the sources of a
    ``torch.distributed`` group are compared. The message names each
    argument that differs and its value on each side; for a copy that
    differs, the first samples that do and each side's first there."""


class LimitError(LoaderError):
    """The daemon has as many sessions as it allows (HTTP 429)."""
    status = 429


class NoSpaceError(LoaderError):
    """The machine has no room for the session's batch memory (HTTP 507)."""
    status = 507


class DaemonGoneError(LoaderError):
    """The daemon could not be reached, or the connection broke."""


class DaemonNotRunningError(DaemonGoneError):
    """Nothing listens on the socket: it does not exist (``ENOENT``) or
    refuses connections (``ECONNREFUSED``). The message asks whether
    loaderd runs at that path and says how to start it. A
    ``DaemonGoneError``: a source reconnecting across a restart retries
    it."""

    def __init__(self, msg: str, path: str) -> None:
        super().__init__(msg)
        self.path = path
        """The socket tried."""


class SocketPermissionError(LoaderError, PermissionError):
    """This process may not connect to the daemon's socket (``EACCES``):
    it is not in the socket's group, or cannot search its directory. The
    message names the socket, its group and how to join it. Also a
    ``PermissionError``; not a ``DaemonGoneError`` (retrying cannot help)."""

    def __init__(self, msg: str, path: str, group: Optional[str], gid: Optional[int]) -> None:
        super().__init__(msg)
        self.path = path
        """The socket tried."""
        self.group = group
        """The socket's group name (its gid as text when it has no name
        here), ``None`` when the socket could not be examined."""
        self.gid = gid
        """The socket's group id, ``None`` when it could not be examined."""


class VersionError(LoaderError):
    """This client and the daemon cannot serve the request across their
    versions: the daemon lacks a feature the request needs, or is older
    than the oldest this client talks to, or this client is older than
    the oldest the daemon serves (HTTP 400, code ``"version"``). The
    message names both versions (release and protocol) and which side to
    upgrade. Not a ``DaemonGoneError``: retrying cannot help."""


class NotLoaderdError(LoaderError):
    """Something listens on the socket and answered, but not as loaderd:
    another HTTP service, or a service that does not speak HTTP. The
    message names the socket and what it answered. Not a
    ``DaemonGoneError``: retrying cannot help."""

    def __init__(self, path: str, answer: str) -> None:
        super().__init__(f"the socket at {path} answered, but not as loaderd: {answer}. Point the client at "
                         "loaderd's socket (socket=PATH, or NVFEED_SOCKET=PATH)")
        self.path = path
        """The socket tried."""
        self.answer = answer
        """What it answered, in short."""


class SampleError(LoaderError):
    """Samples of a batch could not be read. ``errors`` holds one message
    per failed sample (its path relative to the dataset root, and the
    cause); ``positions`` their places in the batch."""

    def __init__(self, epoch: int, iteration: int, positions: list[int], errors: list[str]) -> None:
        self.epoch, self.iteration, self.positions, self.errors = epoch, iteration, positions, errors
        super().__init__(f"epoch {epoch} batch {iteration}: {len(errors)} sample(s) could not be read: " + "; ".join(errors))


_BY_STATUS: dict[int, type[LoaderError]] = {
    400: BadRequestError, 403: ForbiddenError, 404: NotFoundError, 409: ConflictError, 429: LimitError, 507: NoSpaceError,
}


RANK_MISMATCH = "rank_mismatch"
"""The daemon's error code for ranks of one job that disagree
(wire.CodeRankMismatch)."""

VERSION = "version"
"""The daemon's error code for a refusal across versions
(wire.CodeVersion)."""

_BY_CODE: dict[str, type[LoaderError]] = {RANK_MISMATCH: RankMismatchError, VERSION: VersionError}


def error_for(msg: str, status: Optional[int], code: Optional[str] = None) -> LoaderError:
    """The LoaderError subclass for a daemon's error.

    Parameters
    ----------
    msg : str
        The message, for people; never parsed.
    status : int or None
        The HTTP status (``None``: no answer).
    code : str or None
        The daemon's error code; one with a class of its own
        (``"rank_mismatch"``: ``RankMismatchError``; ``"version"``:
        ``VersionError``) picks it, else the
        status does.

    Returns
    -------
    LoaderError
        The error to raise, carrying ``status`` and ``code`` (as
        ``error_code``).
    """
    cls = _BY_CODE.get(code or "") or (_BY_STATUS.get(status, LoaderError) if status is not None else LoaderError)
    return cls(msg, status, code)


REAPED = "reaped"
"""The daemon's error code for a session it closed as idle (404): its
client reopens it where it was."""


def reconnect_message(cause: LoaderError, socket: str, timeout: float, at: tuple[int, int]) -> str:
    """The warning of a source reopening its session at ``at`` (epoch,
    batch): the daemon closed it as idle (code ``"reaped"``: the daemon is
    up), or went away (``cause``; retried for ``timeout`` seconds)."""
    if cause.error_code == REAPED:
        return f"LoaderSource: {cause}; reopening it at epoch {at[0]} batch {at[1]}"
    return f"LoaderSource: loaderd at {socket} went away ({cause}); reconnecting for up to {timeout:g} s"
