# SPDX-License-Identifier: Apache-2.0
"""A source's session with loaderd. It opens the session and maps its
batch memory. It reopens the session where the source stands when the
daemon goes away. It gives batches back, with GPU fences. Its transport
(``_transport``) asks for the next descriptor. No batch views here."""

from __future__ import annotations

import collections
import mmap
import os
import time
import warnings
from typing import Any, Optional, cast

import numpy as np

from . import _content
from . import _resume
from ._cuda import CudaError, device_uuid, load_libcuda, session_device
from ._cudamem import DeviceMapping
from ._fence import ReleaseFence
from ._errors import BadRequestError, DaemonGoneError, LoaderError, NotFoundError, error_for, reconnect_message
from ._http import UnixHTTPConnection, call, hello
from ._memory import map_host, receive, unmap_unless_viewed
from ._options import SourceOptions
from ._transport import Transport
from ._upgrade import UpgradeError
from ._version import DaemonVersion, fit, refused
from ._views import DaliTypes, Mapped
from ._wdsskip import skipped_of
from ._wire import MemoryDesc, NextResponse, OpenRequest, OpenResponse, State


class Session:
    """One open session for the options ``o``: its id, its mapping, the
    slots of batches held, and its position (the next batch). ``dali``:
    the DALI types batches are made of, if any. It owns its transport.
    What its open answered (``backend``, ``fingerprint``, ...) is
    documented where ``LoaderSource`` gives it."""

    def __init__(self, o: SourceOptions, dali: Optional[DaliTypes]) -> None:
        self._timeout, self._socket = o.timeout, o.socket
        self._dali = dali
        self.expect: Optional[tuple[int, int]] = None
        """The position of the next batch the source returns."""
        self._told_not_raw = False  # the open's not_raw is warned of once per source, not at every reconnect
        self._conn = UnixHTTPConnection(o.socket, o.timeout)
        self.transport = Transport(o.transport, o.socket, o.timeout, self._conn)
        self.id: Optional[str] = None
        """The session's id; None once closed."""
        self._held: collections.deque[int] = collections.deque()
        self._give_back: list[int] = []  # slots of batches not handed out (failed)
        self._reconnect_timeout = o.reconnect_timeout
        self.gpu: Optional[DeviceMapping] = None
        """The GPU batch memory, if the batches are there."""
        self._mm: Optional[mmap.mmap] = None  # host batch memory
        self._buf: np.ndarray[Any, np.dtype[np.uint8]] = np.empty(0, dtype=np.uint8)
        self.mapped = Mapped(None, self._buf, None, dali)
        """The batch memory, as the batch views take it."""
        self._fence: Optional[ReleaseFence] = None
        self._cu: Any = None
        self._device_id = o.device_id
        self._uuid = ""
        self._cuda_stream = o.cuda_stream  # kept alive: its handle is used at every release
        req = o.open_request()
        st = req.get("state")
        if st is not None:  # from a run of other shards or batch size: resumed (_resume)
            req["state"] = _resume.for_source(st, req["shard_id"], req["num_shards"], req["batch_size"])
        if o.device == "gpu":
            # This process's GPU, named by UUID: the daemon's ordinals may differ.
            self._cu = load_libcuda()
            self._uuid = req["device_uuid"] = device_uuid(self._cu, o.device_id)
            self._fence = ReleaseFence(self._cu, o.device_id, o.stream)
        self.request = req
        """The open request; a reopen sends it again at the source's position."""
        try:
            self._open(req)
        except BaseException:
            try:
                self.close()
            except CudaError:
                pass  # the failure that brought us here is the one to raise
            raise
        if self.fingerprint:
            self.request["fingerprint"] = self.fingerprint  # a reopen reads this dataset or none

    def _open(self, req: OpenRequest) -> None:
        """Opens a session and maps its batch memory. The request is fitted
        to the daemon's version, asked first: it may have been upgraded."""
        self.daemon: DaemonVersion = hello(self._conn, self._socket)
        try:
            r = cast(OpenResponse, self.call("POST", "/v1/sessions", fit(req, self.daemon, self._socket)))
        except BadRequestError as e:
            err = refused(e, self.daemon, self._socket)
            if err is e:
                raise
            raise err from e
        self.id = r["id"]
        self.backend: str = r["backend"]
        self.backend_why: str = r.get("backend_why", "")  # "" from a daemon that gives none
        self.gpu_path: str = r["gpu_path"]
        if r.get("not_raw") and not self._told_not_raw:
            self._told_not_raw = True
            why = "; ".join(f"{c['samples']} {c['cause'].replace('_', ' ')} (fix: {c['fix']})" for c in r["not_raw"])
            warnings.warn(f"LoaderSource: dataset {req['dataset']}: {sum(c['samples'] for c in r['not_raw'])} samples are read "
                          f"through the filesystem, not raw by {self.backend}: {why}", RuntimeWarning, stacklevel=6)
        self.release_after: int = r["release_after"]
        """Batches after which a batch's memory goes back to the daemon."""
        self.prefetch_queue_depth: int = r["prefetch_queue_depth"]
        self.epoch_batches: int = r["epoch_batches"]
        """Batches in the current epoch for this shard."""
        self.expect = (r["epoch"], r["iteration"])
        self.state0: State = r["state"]
        """The position at open, with its sampling."""
        self.content = _content.of(r)
        """The dataset by its samples' names, sizes and labels, the same on
        every node holding the same files (``None`` from a daemon that gives
        none): what ranks compare to name a difference."""
        self.fingerprint: str = r.get("fingerprint", "")  # "" from a daemon that gives none
        self.reader: str = r.get("reader") or "file"  # a daemon before numpy datasets serves files only
        self.components: int = r.get("components") or 0
        self.skipped_at_open = skipped_of(r)  # webdataset "skip": left out every epoch (_wdsskip)
        try:
            mr, fd = receive(self._socket, r["id"], self._timeout)
        except UpgradeError as e:
            self.close()
            raise error_for(f"loaderd: session {r['id']}: cannot receive its batch memory: {e}", e.status,
                            e.error_code) from e
        desc = mr["memory"]
        self.memory: MemoryDesc = desc
        old_gpu = self.gpu
        try:
            if desc["kind"] == "gpu":
                dev = session_device(self._cu, r["id"], desc.get("uuid") or "", self._device_id, self._uuid)
                self.gpu = DeviceMapping(fd, desc["size"], dev, lib=self._cu)
                self._buf = np.empty(0, dtype=np.uint8)
            else:
                self._mm = map_host(fd, desc["size"])
                self._buf = np.frombuffer(self._mm, dtype=np.uint8)
        except (CudaError, OSError) as e:
            try:
                self.close()
            except CudaError:
                pass  # the failure to map is the one to raise
            raise LoaderError(f"loaderd: session {r['id']}: cannot map its {desc['kind']} batch memory: {e}") from e
        finally:
            os.close(fd)
        self.mapped = Mapped(self._mm if self.gpu is None else None, self._buf, self.gpu, self._dali)
        if old_gpu is not None and old_gpu is not self.gpu:
            # The old session's memory (a reconnect): unmapped now, or when
            # the last array handed out from it dies.
            try:
                old_gpu.retire()
            except CudaError as e:
                warnings.warn(f"LoaderSource: unmapping the previous session's GPU memory: {e}", RuntimeWarning,
                              stacklevel=2)

    def state(self) -> State:
        """The position of the next batch the source produces, with the
        sampling. The daemon may have read ahead into a stream: the
        source's own position is then the stream's next frame."""
        st = cast(State, self.call("GET", f"/v1/sessions/{self.id}/state"))
        if self.transport.streaming and self.expect is not None:
            st["epoch"], st["batch"] = self.expect
        return st

    def _here(self) -> OpenRequest:
        """The open request, resuming at the source's position."""
        epoch, batch = cast(tuple[int, int], self.expect)
        req = cast(OpenRequest, dict(self.request))
        req["state"] = _resume.at(self.state0, epoch, batch)
        return req

    def _forget_slots(self) -> None:
        """Slots of the old session mean nothing to a new one. What DALI
        still holds keeps its memory (the old mapping) alive."""
        self._held.clear()
        self._give_back.clear()
        if self._fence is not None:
            self._fence.forget()

    def _kept(self) -> list[int]:
        """The slots the source still holds: those of batches handed out,
        and those held back for the consumer's GPU work."""
        return list(self._held) + (self._fence.held if self._fence is not None else [])

    def hold(self, slot: int) -> None:
        """Holds a batch handed out as a view, until ``release_after`` more."""
        self._held.append(slot)

    def give_back(self, slot: int) -> None:
        """Gives a slot back with the next request: its batch was copied
        or not handed out."""
        self._give_back.append(slot)

    def _reconnect(self, cause: LoaderError) -> None:
        """Reopens the session at the source's position after the daemon
        went away, or closed it as idle (code "reaped"), saying which. It
        retries with backoff for reconnect_timeout seconds."""
        if self._reconnect_timeout <= 0 or self.expect is None:
            raise cause
        since = time.time()
        deadline = time.monotonic() + self._reconnect_timeout
        self.transport.drop()
        self._conn.close()
        req = self._here()
        delay, last = 0.05, str(cause)
        warnings.warn(reconnect_message(cause, self._socket, self._reconnect_timeout, self.expect), RuntimeWarning,
                      stacklevel=5)
        # A daemon that lives on (only the stream broke) frees the old
        # session now rather than when it is reaped as idle. Arrays handed
        # out keep their memory mapped either way.
        conn = UnixHTTPConnection(self._socket, min(self._timeout, 5.0))
        try:
            call(conn, self._socket, "DELETE", f"/v1/sessions/{self.id}")
        except LoaderError:
            pass
        finally:
            conn.close()
        while True:
            try:
                self._open(req)
                break
            except DaemonGoneError as e:
                last = str(e)
            if time.monotonic() >= deadline:
                raise DaemonGoneError(f"loaderd at {self._socket} gone since {time.strftime('%H:%M:%S', time.localtime(since))} "
                                      f"({time.time() - since:.0f} s without it): {last}") from cause
            time.sleep(delay)
            delay = min(2 * delay, 1.0)
        self._forget_slots()

    def reopen(self, release_after: int) -> None:
        """Reopens the session at the source's position with another
        release_after: the DALI pipeline it feeds needs more."""
        self.request["release_after"] = release_after
        self.transport.drop()
        req = self._here()
        try:
            self.call("DELETE", f"/v1/sessions/{self.id}")  # first: its shard leaves the job
        except NotFoundError:
            pass
        self._open(req)
        self._forget_slots()  # arrays handed out keep the old session's memory mapped

    def deliver(self, at: Optional[tuple[int, int]]) -> NextResponse:
        """The next descriptor (at ``at``), giving back what may go.

        Batches with release_after later batches delivered go back with
        this request. GPU memory goes back only once the consumer's GPU
        work queued on it has finished: an event on the consumer's stream.
        That wait is skipped while the daemon still has room to read ahead
        (prefetch_queue_depth slots held back at most). It reconnects when
        the daemon went away. A fence call that fails raises with no slot
        lost: each stays held, and the next call tries again.
        """
        release = list(self._give_back)
        while len(self._held) > self.release_after:
            slot = self._held[0]
            if self._fence is None:
                release.append(slot)
            else:
                self._fence.record(slot)  # CudaError: the slot stays held
            self._held.popleft()
        if self._fence is not None:
            release += self._fence.done(self.prefetch_queue_depth)
        self._give_back = []
        try:
            return self.transport.next(cast(str, self.id), release, at, self.expect, self._kept())
        except (DaemonGoneError, NotFoundError) as e:  # NotFound: a restarted daemon does not know the session
            self._reconnect(e)
            return self.transport.next(cast(str, self.id), [], at, self.expect, self._kept())

    def call(self, method: str, path: str, body: Optional[Any] = None) -> Any:
        """One request to the daemon over the session's connection."""
        return call(self._conn, self._socket, method, path, body)

    def close(self) -> None:
        """Ends the session. Batches handed out stay readable.

        Raises
        ------
        CudaError
            Unmapping GPU memory or closing the fence failed, after the
            rest of the cleanup.
        """
        self.transport.drop()
        if self.id is not None:
            try:
                self.call("DELETE", f"/v1/sessions/{self.id}")
            except LoaderError:
                pass
            self.id = None
        self._conn.close()
        self._unmap_host()
        errors: list[CudaError] = []
        gpu, self.gpu = self.gpu, None
        fence, self._fence = self._fence, None
        for close in (gpu.retire if gpu is not None else None, fence.close if fence is not None else None):
            if close is not None:
                try:
                    close()
                except CudaError as e:
                    errors.append(e)
        if errors:
            raise errors[0]

    def _unmap_host(self) -> None:
        """Unmaps host batch memory at close unless a batch views it."""
        mm, self._mm = self._mm, None
        self._buf = np.empty(0, dtype=np.uint8)
        self.mapped = Mapped(None, self._buf, self.mapped.gpu, self._dali)
        unmap_unless_viewed(mm)
