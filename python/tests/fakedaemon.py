# SPDX-License-Identifier: Apache-2.0
"""A daemon double for LoaderSource's unit tests: it answers the source's
requests (open, next, delete) in process, by replacing the client's
``call`` and ``receive``, and shares one event log with the libcuda
double, so a test sees what the source did in which order (a release
sent to the daemon after the consumer's work was waited for). Batch
memory: a memfd with each sample's bytes (its label, repeated) for host
memory; for GPU memory only the description (the libcuda double maps
nothing)."""

from __future__ import annotations

import os
from typing import Any, Optional

import pytest

from fakecuda import FakeCuda, uuid_bytes
from nvfeed import DaemonGoneError
from nvfeed._cuda import format_uuid
from nvfeed._version import PROTOCOL, UNVERSIONED_FEATURES, DaemonVersion

SLOT = 2 << 20


class FakeDaemon:
    """``gpu_order`` lists the daemon's GPUs (physical indices, its
    ordinals); ``dense`` packs samples back to back (else 4 KiB apart,
    sizes varying); ``gone_at`` makes the n-th next request (1-based) find
    the daemon gone once."""

    def __init__(self, batches: int = 4, batch_size: int = 3, sample: int = 1000, slots: int = 6,
                 gpu_order: tuple[int, ...] = (0, 1), dense: bool = True, gone_at: int = 0,
                 failed: Optional[list[int]] = None) -> None:
        self.batches, self.batch_size, self.sample, self.slots = batches, batch_size, sample, slots
        self.gpu_order, self.dense, self.gone_at = gpu_order, dense, gone_at
        self.failed = failed or []
        self.log: list[str] = []
        self.requests: list[tuple[str, str, Any]] = []
        self.sessions = 0
        self.nexts = 0
        self.pos = 0
        self.epoch = 0
        self.released: list[int] = []
        self.kind = "pinned"
        self.device = -1
        self.fds: list[int] = []

    def install(self, monkeypatch: pytest.MonkeyPatch, cu: Optional[FakeCuda]) -> None:
        """Routes the client's requests here and its libcuda to ``cu``."""
        import nvfeed._cuda
        import nvfeed._session
        import nvfeed._transport
        monkeypatch.setattr(nvfeed._session, "call", self.call)
        monkeypatch.setattr(nvfeed._transport, "call", self.call)
        monkeypatch.setattr(nvfeed._session, "receive", self.receive)
        monkeypatch.setattr(nvfeed._session, "hello", self.hello)
        if cu is not None:
            cu.on_call = self.log.append
            for mod in (nvfeed._session, nvfeed._cuda):
                monkeypatch.setattr(mod, "load_libcuda", lambda: cu)

    def close_fds(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()

    def _uuid(self) -> str:
        return format_uuid(uuid_bytes(self.gpu_order[self.device])) if self.device >= 0 else ""

    def call(self, conn: Any, where: str, method: str, path: str, body: Optional[Any] = None) -> Any:
        self.requests.append((method, path, body))
        if method == "POST" and path == "/v1/sessions":
            return self._open(body)
        if method == "POST" and path.endswith("/next"):
            return self._next(body or {})
        if method == "DELETE":
            self.log.append(f"DELETE {path}")
            return None
        raise AssertionError(f"fake daemon: unexpected {method} {path}")

    def _open(self, req: dict[str, Any]) -> dict[str, Any]:
        self.sessions += 1
        self.kind = "gpu" if req.get("memory") == "gpu" else "pinned"
        if self.kind == "gpu":
            want = req.get("device_uuid", "")
            uuids = [format_uuid(uuid_bytes(p)) for p in self.gpu_order]
            self.device = uuids.index(want) if want in uuids else req["device_id"]
        st = {"version": 1, "sampling": {"n": self.batches * self.batch_size, "batch_size": self.batch_size,
                                         "shard_id": 0, "num_shards": 1, "random_shuffle": False, "seed": 0,
                                         "pad_last_batch": False, "stick_to_shard": False},
              "epoch": self.epoch, "batch": self.pos}
        if req.get("state"):
            self.epoch, self.pos = req["state"]["epoch"], req["state"]["batch"]
        return {"id": f"s{self.sessions}", "backend": "file", "gpu_path": "bounce" if self.kind == "gpu" else "",
                "memory": self.desc(), "prefetch_queue_depth": 2,
                "release_after": req["release_after"] if req.get("release_after") is not None else 3,
                "epoch": self.epoch, "iteration": self.pos, "epoch_batches": self.batches, "state": st}

    def desc(self) -> dict[str, Any]:
        return {"kind": self.kind, "size": self.slots * SLOT, "slot_size": SLOT, "slots": self.slots,
                "device": self.device if self.kind == "gpu" else -1, "numa_node": -1, "uuid": self._uuid()}

    def hello(self, conn: Any, where: str) -> DaemonVersion:
        """The daemon's version: this client's own."""
        return DaemonVersion(PROTOCOL, "fake", UNVERSIONED_FEATURES)

    def receive(self, path: str, session_id: str, timeout: Optional[float]) -> tuple[dict[str, Any], int]:
        size = self.slots * SLOT
        if self.kind == "gpu":
            fd = os.open("/dev/null", os.O_RDONLY)
        else:
            fd = os.memfd_create("fake-batch-memory")
            os.ftruncate(fd, size)
            for b in range(self.batches):
                for i, (o, n) in enumerate(zip(*self._layout(b))):
                    os.pwrite(fd, bytes([self._label(b, i)]) * n, o)
        return {"memory": self.desc()}, fd

    def _label(self, b: int, i: int) -> int:
        return (b * self.batch_size + i) % 251

    def _layout(self, b: int) -> tuple[list[int], list[int]]:
        base = (b % self.slots) * SLOT
        if self.dense:
            return [base + i * self.sample for i in range(self.batch_size)], [self.sample] * self.batch_size
        return [base + i * 4096 for i in range(self.batch_size)], [self.sample - i for i in range(self.batch_size)]

    def _next(self, body: dict[str, Any]) -> dict[str, Any]:
        self.nexts += 1
        rel = body.get("release") or []
        self.released += rel
        self.log.append(f"next release={rel}")
        if self.gone_at and self.nexts == self.gone_at:
            raise DaemonGoneError("fake daemon: gone")
        if body.get("epoch") is not None:
            self.epoch, self.pos = body["epoch"], body["iteration"]
        b = self.pos
        if b >= self.batches:
            self.epoch, self.pos = self.epoch + 1, 0
            return {"end_of_epoch": True, "epoch": self.epoch, "iteration": 0, "epoch_batches": self.batches}
        self.pos += 1
        offsets, lengths = self._layout(b)
        r = {"end_of_epoch": False, "epoch": self.epoch, "iteration": b, "epoch_batches": self.batches, "slot": b % self.slots,
             "offsets": offsets, "lengths": lengths,
             "labels": [self._label(b, i) for i in range(self.batch_size)], "indices": list(range(self.batch_size))}
        if self.failed:
            r["failed"], r["errors"] = self.failed, [f"sample {i}: gone" for i in self.failed]
        return r
