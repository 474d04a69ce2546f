# SPDX-License-Identifier: Apache-2.0
"""How a session asks for its next batch descriptor: a request over HTTP
per batch, or the stream the daemon pushes descriptors on (releases going
back without a reply), opened, moved and dropped here; and the session's
position, which the stream's read-ahead moves."""

from __future__ import annotations

import collections
from typing import Any, Optional, cast

from ._fence import ReleaseFence
from ._errors import DaemonGoneError, error_for
from ._stream import Stream, StreamError
from ._wire import NextRequest, NextResponse, State


class Transport:
    """The next descriptor by the session's transport (``"stream"`` or
    ``"http"``); the session sets the attributes declared here."""

    _transport: str
    _id: Optional[str]
    _socket: str
    _timeout: float
    _stream: Optional[Stream]
    _expect: Optional[tuple[int, int]]
    _held: collections.deque[int]
    _fence: Optional[ReleaseFence]
    _unsent: list[int]  # stream releases held back to go with the next (see _stream_next)

    def _call(self, method: str, path: str, body: Optional[Any] = None) -> Any:
        raise NotImplementedError

    def state(self) -> State:
        """The position of the next batch this source will produce; pass it
        as ``state=`` to resume the iterator form. Under DALI that is ahead of
        the training loop by the batches DALI prefetched
        (``prefetch_queue_depth``): resuming from it skips them. For exact
        resume under DALI use ``source=src.batch, batch_info=True`` with
        ``enable_checkpointing=True`` and ``pipe.checkpoint()``.

        Returns
        -------
        State
            The sampling and the position, for ``LoaderSource(state=...)``.
        """
        st = cast(State, self._call("GET", f"/v1/sessions/{self._id}/state"))
        if self._stream is not None and self._expect is not None:
            # The daemon has read ahead into the stream: the source's own
            # position is the stream's next frame.
            st["epoch"], st["batch"] = self._expect
        return st

    def _next(self, release: list[int], at: Optional[tuple[int, int]]) -> NextResponse:
        """The next descriptor, by the source's transport."""
        if self._transport == "stream":
            return self._stream_next(release, at)
        body: NextRequest = {}
        if release:
            body["release"] = release
        if at is not None:
            body["epoch"], body["iteration"] = at
        return cast(NextResponse, self._call("POST", f"/v1/sessions/{self._id}/next", body or None))

    def _stream_next(self, release: list[int], at: Optional[tuple[int, int]]) -> NextResponse:
        """The next frame of the stream, opening it (at at) or moving it
        when at is not where the stream is."""
        try:
            if self._stream is not None and at is not None and at != self._expect:
                self._stream.stop(keep=self._kept())  # what DALI still holds stays held
                self._stream, self._unsent = None, []
            if self._stream is None:
                # From the source's own position (known since the open, kept
                # by every batch): no request for it. What this source still
                # holds is kept; everything else the daemon delivered
                # (release included) goes back before the first frame.
                if at is not None:
                    self._expect = at
                self._stream = Stream(self._socket, cast(str, self._id), self._timeout, self._expect, self._kept())
                self._unsent = []
            elif release or self._unsent:
                # One control frame for two batches where the daemon is
                # ahead: a release is held back while the next frame is
                # already here (the daemon read ahead without it), at most
                # one batch, and goes with the next; never while this
                # source waits for a frame (the daemon may be waiting for
                # the slot). Half the release frames, and the daemon's
                # wake-ups to read them, where the client is the slower.
                # A call with nothing to release (a GPU fence still holds
                # its batches) sends what was held back.
                self._unsent += release
                if len(self._unsent) > len(release) or not self._stream.ready():
                    self._stream.send({"release": self._unsent})
                    self._unsent = []
            r = cast(NextResponse, self._stream.recv())
        except StreamError as e:
            self._drop_stream()
            if e.status is not None:
                raise error_for(f"loaderd: stream: {e}", e.status, e.error_code) from e
            raise DaemonGoneError(f"loaderd at {self._socket}: stream: {e}") from e
        if r.get("error"):
            self._drop_stream()
            raise error_for(f"loaderd: {r['error']}", r.get("error_status"), r.get("error_code"))
        return r

    def _kept(self) -> list[int]:
        """The slots this source still holds: those of batches handed out,
        and those held back for the consumer's GPU work."""
        return list(self._held) + (self._fence.held if self._fence is not None else [])

    def _drop_stream(self) -> None:
        # Releases not sent are not lost: a stream's start (and a stop)
        # releases every delivered batch but those the source keeps.
        self._unsent = []
        if self._stream is not None:
            self._stream.close()
            self._stream = None
