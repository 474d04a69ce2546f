# SPDX-License-Identifier: Apache-2.0
"""A source's session with loaderd: opening it and mapping its batch
memory, reopening it where the source stands when the daemon goes away,
and giving batches back with GPU fences; ``_transport`` asks for the
next descriptor over HTTP or the stream. No batch views here."""

from __future__ import annotations

import collections
import mmap
import os
import time
import warnings
from typing import Any, Optional, cast

import numpy as np

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


class Session(Transport):
    """One open session for the options ``o``: its id, mapping, the slots
    of batches held, and its position (the next batch). ``dali``: the
    DALI types batches are made of, if any."""

    def __init__(self, o: SourceOptions, dali: Optional[DaliTypes]) -> None:
        self._transport, self._timeout, self._socket = o.transport, o.timeout, o.socket
        self._on_error = o.on_error
        self._dali = dali
        self._stream = None
        self._expect: Optional[tuple[int, int]] = None  # the position of the next batch this source returns
        self.skipped_samples = 0
        self._skip_told = -1  # the last epoch whose webdataset skip was warned of (_wdsskip)
        self._told_not_raw = False  # the open's not_raw is warned of once per source, not at every reconnect
        self._conn = UnixHTTPConnection(o.socket, o.timeout)
        self._id: Optional[str] = None
        self._held: collections.deque[int] = collections.deque()
        self._give_back: list[int] = []  # slots of batches not handed out (failed)
        self._unsent: list[int] = []
        self._reconnect_timeout = o.reconnect_timeout
        self._gpu: Optional[DeviceMapping] = None
        self._mm: Optional[mmap.mmap] = None  # host batch memory
        self._buf: np.ndarray[Any, np.dtype[np.uint8]] = np.empty(0, dtype=np.uint8)
        self._mapped = Mapped(None, self._buf, None, dali)
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
        self._req = req
        try:
            self._open(req)
        except BaseException:
            try:
                self.close()
            except CudaError:
                pass  # the failure that brought us here is the one to raise
            raise
        if self.fingerprint:
            self._req["fingerprint"] = self.fingerprint  # a reopen reads this dataset or none

    def _open(self, req: OpenRequest) -> None:
        """Opens a session and maps its batch memory; the request fitted to
        the daemon's version, asked first (it may have been upgraded since)."""
        self.daemon: DaemonVersion = hello(self._conn, self._socket)
        """The daemon's version (release, protocol, features)."""
        try:
            r = cast(OpenResponse, self._call("POST", "/v1/sessions", fit(req, self.daemon, self._socket)))
        except BadRequestError as e:
            err = refused(e, self.daemon, self._socket)
            if err is e:
                raise
            raise err from e
        self._id = r["id"]
        self.backend: str = r["backend"]
        """The backend that reads for this source (the daemon's default filled in)."""
        self.backend_why: str = r.get("backend_why", "")  # "" from a daemon that gives none
        """Why that backend when none was named: the fastest the dataset allows
        (raw reads, ``gds``, from a block device's map; else ``file``); "" when named."""
        self.gpu_path: str = r["gpu_path"]
        if r.get("not_raw") and not self._told_not_raw:
            self._told_not_raw = True
            why = "; ".join(f"{c['samples']} {c['cause'].replace('_', ' ')} (fix: {c['fix']})" for c in r["not_raw"])
            warnings.warn(f"LoaderSource: dataset {req['dataset']}: {sum(c['samples'] for c in r['not_raw'])} samples are read "
                          f"through the filesystem, not raw by {self.backend}: {why}", RuntimeWarning, stacklevel=4)
        """For GPU batches, the path that runs: "cufile" or "bounce"; else ""."""
        self._release_after: int = r["release_after"]
        self.prefetch_queue_depth: int = r["prefetch_queue_depth"]
        self._epoch_batches: int = r["epoch_batches"]
        self._expect = (r["epoch"], r["iteration"])
        self._state0: State = r["state"]
        self.fingerprint: str = r.get("fingerprint", "")  # "" from a daemon that gives none
        """The dataset's fingerprint: 32 hex digits naming its samples (paths,
        labels, sizes), the same on every node holding the same files."""
        self.reader: str = r.get("reader") or "file"  # a daemon before numpy datasets serves files only
        """The DALI reader whose samples the dataset holds: ``"file"``
        (encoded files: each batch is its samples and labels) or
        ``"numpy"`` (``.npy`` arrays: each batch is the arrays alone)."""
        self.components: int = r.get("components") or 0
        """WebDataset: the outputs of a sample (``len(ext)``); 0 otherwise."""
        self.skipped_at_open = skipped_of(r)  # webdataset "skip": left out every epoch (_wdsskip)
        try:
            mr, fd = receive(self._socket, r["id"], self._timeout)
        except UpgradeError as e:
            self.close()
            raise error_for(f"loaderd: session {r['id']}: cannot receive its batch memory: {e}", e.status,
                            e.error_code) from e
        desc = mr["memory"]
        self.memory: MemoryDesc = desc
        """The session's batch memory: kind, size, slot size, slots, device."""
        old_gpu = self._gpu
        try:
            if desc["kind"] == "gpu":
                dev = session_device(self._cu, r["id"], desc.get("uuid") or "", self._device_id, self._uuid)
                self._gpu = DeviceMapping(fd, desc["size"], dev, lib=self._cu)
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
        self._mapped = Mapped(self._mm if self._gpu is None else None, self._buf, self._gpu, self._dali)
        if old_gpu is not None and old_gpu is not self._gpu:
            # The old session's memory (a reconnect): unmapped now, or when
            # the last array handed out from it dies.
            try:
                old_gpu.retire()
            except CudaError as e:
                warnings.warn(f"LoaderSource: unmapping the previous session's GPU memory: {e}", RuntimeWarning,
                              stacklevel=2)

    def _here(self) -> OpenRequest:
        """The open request, resuming at this source's position."""
        epoch, batch = cast(tuple[int, int], self._expect)
        req = cast(OpenRequest, dict(self._req))
        req["state"] = _resume.at(self._state0, epoch, batch)
        return req

    def _forget_slots(self) -> None:
        """Slots of the old session mean nothing to a new one; what DALI
        still holds keeps its memory (the old mapping) alive."""
        self._held.clear()
        self._give_back.clear()
        if self._fence is not None:
            self._fence.forget()

    def _reconnect(self, cause: LoaderError) -> None:
        """Reopens the session at this source's position after the daemon
        went away, retrying with backoff for reconnect_timeout seconds, or
        after the daemon closed it as idle (code "reaped"), saying which."""
        if self._reconnect_timeout <= 0 or self._expect is None:
            raise cause
        since = time.time()
        deadline = time.monotonic() + self._reconnect_timeout
        self._drop_stream()
        self._conn.close()
        req = self._here()
        delay, last = 0.05, str(cause)
        warnings.warn(reconnect_message(cause, self._socket, self._reconnect_timeout, self._expect), RuntimeWarning,
                      stacklevel=5)
        # A daemon that lives on (only the stream broke) frees the old
        # session now rather than when it is reaped as idle; arrays handed
        # out keep their memory mapped either way.
        conn = UnixHTTPConnection(self._socket, min(self._timeout, 5.0))
        try:
            call(conn, self._socket, "DELETE", f"/v1/sessions/{self._id}")
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

    def _reopen(self, release_after: int) -> None:
        """Reopens the session at this source's position with another
        release_after (the DALI pipeline it feeds needs more)."""
        self._req["release_after"] = release_after
        self._drop_stream()
        req = self._here()
        try:
            self._call("DELETE", f"/v1/sessions/{self._id}")  # first: its shard leaves the job
        except NotFoundError:
            pass
        self._open(req)
        self._forget_slots()  # arrays handed out keep the old session's memory mapped

    def _deliver(self, at: Optional[tuple[int, int]]) -> NextResponse:
        """The next descriptor (at at), giving back what may go: batches
        with release_after later batches delivered go back to the daemon
        with this request (one round trip per batch); GPU memory only once
        the consumer's GPU work queued on it has finished (an event on the
        consumer's stream), without waiting for it while the daemon still
        has room to read ahead (prefetch_queue_depth slots held back at
        most). Reconnects when the daemon went away. A fence call that
        fails raises with no slot lost: each stays held (or held back) and
        the next call tries again."""
        release = list(self._give_back)
        while len(self._held) > self._release_after:
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
            return self._next(release, at)
        except (DaemonGoneError, NotFoundError) as e:  # NotFound: a restarted daemon does not know the session
            self._reconnect(e)
            return self._next([], at)

    def _call(self, method: str, path: str, body: Optional[Any] = None) -> Any:
        return call(self._conn, self._socket, method, path, body)

    def __len__(self) -> int:
        """Batches in the current epoch for this shard."""
        return self._epoch_batches

    def close(self) -> None:
        """Ends the session. Batches handed out stay readable: GPU memory is
        unmapped now when no ``CudaArray`` of it lives, else when the last
        one dies (or at interpreter exit), after the device's queued work.

        Raises
        ------
        CudaError
            Unmapping GPU memory or closing the fence failed (the call
            named), after the rest of the cleanup.
        """
        self._drop_stream()
        if self._id is not None:
            try:
                self._call("DELETE", f"/v1/sessions/{self._id}")
            except LoaderError:
                pass
            self._id = None
        self._conn.close()
        self._closed()
        self._unmap_host()
        errors: list[CudaError] = []
        gpu, self._gpu = self._gpu, None
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
        self._mapped = Mapped(None, self._buf, self._mapped.gpu, self._dali)
        unmap_unless_viewed(mm)

    def _closed(self) -> None:
        """What a subclass forgets at close (before GPU memory is unmapped)."""
