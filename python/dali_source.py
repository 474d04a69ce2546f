"""A DALI ``fn.external_source`` source that reads batches from loaderd.

::

    from dali_source import LoaderSource
    src = LoaderSource("imagenet", socket="/run/loaderd.sock", batch_size=64,
                       shard_id=0, num_shards=1, random_shuffle=True, seed=0,
                       backend="gds")
    jpegs, labels = fn.external_source(source=src, num_outputs=2, batch=True,
                                       dtype=[types.UINT8, types.INT32])

Each ``next()`` returns ``(samples, labels)``: a list of 1-D uint8 numpy
arrays that view the daemon's shared memory (no copy) and int32 labels of
shape (batch, 1). At the end of an epoch it raises ``StopIteration``;
iterating again starts the next epoch, as DALI does after
``pipeline.reset()``. A batch's memory is given back to the daemon only
after ``release_after`` (default ``prefetch_queue_depth + 1``) later
batches, so DALI may use it with ``no_copy=True``.

Needs only the standard library, numpy and msgpack.
"""

from __future__ import annotations

import collections
import http.client
import mmap
import os
import socket as _socket
from typing import Any

import msgpack
import numpy as np

__all__ = ["LoaderError", "LoaderSource"]


class LoaderError(RuntimeError):
    """An error reported by loaderd, or the daemon could not be reached."""


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("loaderd", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


class LoaderSource:
    """Batches of one shard of a dataset registered with loaderd."""

    def __init__(self, dataset: str, socket: str = "/run/loaderd.sock", batch_size: int = 64,
                 shard_id: int = 0, num_shards: int = 1, random_shuffle: bool = False, seed: int = 0,
                 pad_last_batch: bool = False, stick_to_shard: bool = False, backend: str = "file",
                 prefetch_queue_depth: int = 2, release_after: int | None = None,
                 state: dict[str, Any] | None = None, timeout: float = 600.0) -> None:
        self._socket = socket
        self._release_after = prefetch_queue_depth + 1 if release_after is None else release_after
        if self._release_after < 0:
            raise ValueError(f"release_after must be >= 0, got {self._release_after}")
        self._conn = _UnixHTTPConnection(socket, timeout)
        self._id: str | None = None
        self._held: collections.deque[int] = collections.deque()
        r = self._call("POST", "/v1/sessions", {
            "dataset": dataset, "backend": backend, "batch_size": batch_size, "shard_id": shard_id,
            "num_shards": num_shards, "random_shuffle": random_shuffle, "seed": seed,
            "pad_last_batch": pad_last_batch, "stick_to_shard": stick_to_shard,
            "prefetch_queue_depth": prefetch_queue_depth, "memory": "pinned",
            "hold": self._release_after + 2, "state": state,
        })
        self._id = r["id"]
        self._epoch_batches: int = r["epoch_batches"]
        try:
            fd = os.open(r["shm"], os.O_RDONLY)
            try:
                self._mm = mmap.mmap(fd, r["shm_size"], prot=mmap.PROT_READ)
            finally:
                os.close(fd)
        except OSError as e:
            self.close()
            raise LoaderError(f"cannot map the session's shared memory {r['shm']}: {e}") from e
        self._buf = np.frombuffer(self._mm, dtype=np.uint8)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = msgpack.packb(body) if body is not None else None
        try:
            self._conn.request(method, path, body=data, headers={"Content-Type": "application/msgpack"})
            resp = self._conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException) as e:
            self._conn.close()
            raise LoaderError(f"loaderd at {self._socket}: {method} {path}: {e}") from e
        if resp.status >= 400:
            try:
                msg = msgpack.unpackb(raw)["error"]
            except Exception:
                msg = raw.decode(errors="replace")
            raise LoaderError(f"loaderd: {msg} (HTTP {resp.status})")
        return msgpack.unpackb(raw) if raw else None

    def __iter__(self) -> LoaderSource:
        return self

    def __next__(self) -> tuple[list[np.ndarray], np.ndarray]:
        if self._id is None:
            raise LoaderError("LoaderSource is closed")
        # Batches with release_after later batches delivered go back to the
        # daemon with this request (one round trip per batch).
        release = []
        while len(self._held) > self._release_after:
            release.append(self._held.popleft())
        r = self._call("POST", f"/v1/sessions/{self._id}/next", {"release": release} if release else None)
        if r["end_of_epoch"]:
            self._epoch_batches = r["epoch_batches"]
            raise StopIteration
        self._held.append(r["slot"])
        buf = self._buf
        samples = [buf[o:o + n] for o, n in zip(r["offsets"], r["lengths"])]
        labels = np.asarray(r["labels"], dtype=np.int32).reshape(-1, 1)
        return samples, labels

    def __len__(self) -> int:
        """Batches in the current epoch for this shard."""
        return self._epoch_batches

    def state(self) -> dict[str, Any]:
        """The position of the next batch; pass it as ``state=`` to resume."""
        return self._call("GET", f"/v1/sessions/{self._id}/state")

    def close(self) -> None:
        """Ends the session. Arrays from this source must no longer be used."""
        if self._id is not None:
            try:
                self._call("DELETE", f"/v1/sessions/{self._id}")
            except LoaderError:
                pass
            self._id = None
        self._conn.close()

    def __enter__(self) -> LoaderSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
