# SPDX-License-Identifier: Apache-2.0
"""Processes of test_standin.py, each loading the CUDA stand-in through the
client's discovery (NVFEED_CUDA_LIB_DIR) with its own
CUDA_VISIBLE_DEVICES:

  exporter SOCK       plays the daemon: device memory on its GPU 1, pattern
                      A written, the descriptor and the GPU's UUID sent;
                      on "released" writes pattern B (the slot reused)
  importer SOCK MODE  plays the client: finds the GPU by UUID, maps the
                      memory (DeviceMapping), checks pattern A, starts a
                      slow "kernel" reading it on a stream of its own,
                      waits as MODE says (ctx: the default fence; stream:
                      the fence on that stream; none: as the client did
                      before, host timing only), says "released", and
                      prints what the kernel read; holds an array of the
                      mapping at exit with MODE exit-*
  source MODE         one process: LoaderSource(device="gpu") over the
                      daemon double whose batch memory is stand-in device
                      memory; MODE names what it checks
  flow SOCK WANT ARGS a client of a real loaderd (test_standin_daemon.py)

Each prints one JSON line of results."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import socket
import sys
import warnings
from typing import Any, Optional

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

from nvfeed._cuda import device_uuid, find_device, load_libcuda  # noqa: E402
from nvfeed._cudamem import CudaArray, DeviceMapping  # noqa: E402
from nvfeed._fence import ReleaseFence  # noqa: E402
from standin import GRAN, Context, DeviceMemory  # noqa: E402

DELAY_US = 300_000


def pattern(tag: bytes, n: int) -> bytes:
    return (tag * (n // len(tag) + 1))[:n]


def send(s: socket.socket, msg: dict[str, Any], fds: Optional[list[int]] = None) -> None:
    data = json.dumps(msg).encode() + b"\n"
    if fds:
        socket.send_fds(s, [data], fds)
    else:
        s.sendall(data)


def recv(s: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(s, 4096, 4)
    return json.loads(data.decode()), fds


def exporter(sock: socket.socket) -> None:
    cu = load_libcuda()
    ctx = Context(cu, 1)
    mem = DeviceMemory(ctx, 2 * GRAN)
    ctx.write(mem.ptr, pattern(b"A", mem.size))
    fd = mem.export()
    send(sock, {"uuid": device_uuid(cu, 1), "size": mem.size}, [fd])
    os.close(fd)
    msg, _ = recv(sock)
    assert msg["say"] == "released", msg
    ctx.write(mem.ptr, pattern(b"B", mem.size))  # the daemon reuses the slot at once
    send(sock, {"say": "written"})
    msg, _ = recv(sock)
    assert msg["say"] == "done", msg
    mem.free()
    ctx.release()
    print(json.dumps({"exporter": "ok"}))


def importer(sock: socket.socket, mode: str) -> None:
    msg, fds = recv(sock)
    cu = load_libcuda()
    dev = find_device(cu, msg["uuid"])
    m = DeviceMapping(fds[0], msg["size"], dev, lib=cu)
    os.close(fds[0])
    ctx = Context(cu, dev)
    first = ctx.read(m.ptr, 16)
    s = ctx.stream()
    buf = ctypes.create_string_buffer(4096)
    ctx.launch_read(s, m.ptr + GRAN, buf, DELAY_US)  # the consumer's kernel, still queued
    fence: Optional[ReleaseFence] = None
    if mode in ("ctx", "stream", "exit-ctx"):
        fence = ReleaseFence(cu, dev, s if mode == "stream" else None)
        fence.wait()
    send(sock, {"say": "released"})
    msg, _ = recv(sock)
    assert msg["say"] == "written", msg
    ctx.sync(s)
    ctx.destroy_stream(s)
    out = {"device": dev, "first": first.decode(), "kernel_read": sorted(set(buf.raw.decode()))}
    held = [CudaArray(m.ptr, (2, GRAN), dev, m)]
    m.retire()
    out["mapped_after_retire"] = not m.closed
    if not mode.startswith("exit"):
        held.clear()
        gc.collect()
        out["mapped_after_last_array"] = not m.closed
    if fence is not None:
        fence.close()
    ctx.release()
    send(sock, {"say": "done"})
    print(json.dumps(out), flush=True)
    globals()["held"] = held  # alive until the interpreter exits


def source(mode: str) -> None:
    """LoaderSource over stand-in device memory made in this process by the
    daemon double."""
    import pytest

    from fakedaemon import FakeDaemon

    cu = load_libcuda()
    daemon_ctx = Context(cu, 0)

    class Daemon(FakeDaemon):
        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            self.mems: list[DeviceMemory] = []

        def receive(self, path: str, session_id: str, timeout: Optional[float]) -> tuple[dict[str, Any], int]:
            mem = DeviceMemory(daemon_ctx, self.slots * (2 << 20))
            self.mems.append(mem)
            for b in range(self.batches):  # every batch in its slot, the sample's bytes its label
                for i, (o, n) in enumerate(zip(*self._layout(b))):
                    daemon_ctx.write(mem.ptr + o, bytes([self._label(b, i)]) * n)
            fd = mem.export()
            return {"memory": self.desc()}, fd

        def _next(self, body: dict[str, Any]) -> dict[str, Any]:
            for slot in body.get("release") or []:  # the daemon writes a released slot at once
                daemon_ctx.write(self.mems[-1].ptr + slot * (2 << 20), b"\xee" * (2 << 20))
            return super()._next(body)

    warnings.simplefilter("ignore")
    mp = pytest.MonkeyPatch()
    d = Daemon(batches=4, batch_size=3, sample=4096, slots=6, gone_at=3 if mode == "reconnect" else 0)
    d.install(mp, None)
    from nvfeed import LoaderSource
    out: dict[str, Any] = {}
    ctx = Context(cu, 0)
    if mode in ("race-ctx", "race-stream", "race-none"):
        s = ctx.stream()
        src = LoaderSource("train", socket="/x", batch_size=3, transport="http", device="gpu", release_after=0, zero_copy=True,
                           cuda_stream=s if mode == "race-stream" else None)
        if mode == "race-none":  # as the client was: slots released by host timing alone
            src._session._fence.close()  # type: ignore[union-attr]
            src._session._fence = None
        reads = []
        for samples, labels in src:  # a slow kernel reads every sample; the next fetch releases the batch
            rows = ([(samples.ptr + i * samples.shape[1], samples.shape[1]) for i in range(samples.shape[0])]
                    if isinstance(samples, CudaArray) else [(a.ptr, a.nbytes) for a in samples])  # dense: one array
            for (ptr, n), l in zip(rows, labels.reshape(-1).tolist()):
                buf = ctypes.create_string_buffer(n)
                ctx.launch_read(s, ptr, buf, 50_000)
                reads.append((buf, l))
        ctx.destroy_stream(s)
        out["reads_right"] = sum(set(b.raw) == {l} for b, l in reads)
        out["reads"] = len(reads)
        del samples
        src.close()
    elif mode == "reconnect":
        src = LoaderSource("train", socket="/x", batch_size=3, transport="http", device="gpu", reconnect_timeout=5, zero_copy=True,
                           batch_format="dali")
        held = [next(src), next(src)]  # then the daemon is gone once: a second session, a second mapping
        for samples, labels in src:
            held.append((samples, labels))
        out["sessions"] = d.sessions
        out["dense"] = all(isinstance(x, CudaArray) and x.shape == (3, 4096) for x, _ in held)
        out["bytes_right"] = all(set(ctx.read(x.ptr + i * 4096, 4096)) == {int(l)}
                                 for x, ls in held for i, l in enumerate(ls.as_array().reshape(-1)))
        src.close()
        globals()["held"] = held  # arrays of both mappings alive at exit
    for mem in d.mems:  # the daemon's side goes when its sessions close
        mem.free()
    daemon_ctx.release()
    ctx.release()
    d.close_fds()
    print(json.dumps(out), flush=True)


def flow(socket_path: str, want_path: str, args_json: str) -> None:
    """A client of a real loaderd: every batch of the epochs asked for,
    each sample's bytes read back from the device (by a slow "kernel" on
    the consumer's stream with release_after=0, so the daemon reuses a
    slot as soon as it may) and checked against the files."""
    import hashlib

    from nvfeed import LoaderSource
    want = json.loads(open(want_path).read())  # sha256 -> [path, label]
    kw = json.loads(args_json)
    epochs, delay, fence = kw.pop("epochs", 2), kw.pop("delay_us", 20_000), kw.pop("fence", True)
    cu = load_libcuda()
    ctx = Context(cu, kw.get("device_id", 0))
    s = ctx.stream()
    warnings.simplefilter("ignore")
    src = LoaderSource("train", socket=socket_path, device="gpu", release_after=0, cuda_stream=s, zero_copy=True, **kw)
    if not fence:  # as the client was: slots released by host timing alone
        src._session._fence.close()  # type: ignore[union-attr]
        src._session._fence = None
    reads: list[tuple[Any, int, int]] = []
    dense = 0
    for _ in range(epochs):
        for samples, labels in src:
            labels = labels.as_array() if hasattr(labels, "as_array") else labels
            if isinstance(samples, CudaArray) and len(samples.shape) == 2:  # one dense batch
                dense += 1
                n = samples.shape[1]
                samples = [CudaArray(samples.ptr + i * n, n, samples.device, None) for i in range(samples.shape[0])]
            for a, l in zip(samples, labels.reshape(-1).tolist()):
                buf = ctypes.create_string_buffer(a.nbytes)
                ctx.launch_read(s, a.ptr, buf, delay)
                reads.append((buf, a.nbytes, l))
    ctx.destroy_stream(s)
    bad = [i for i, (b, n, l) in enumerate(reads)
           if want.get(hashlib.sha256(b.raw[:n]).hexdigest(), [None, None])[1] != l]
    out = {"samples": len(reads), "bad": bad[:10], "gpu_path": src.gpu_path, "dense_batches": dense,
           "uuid": src.memory.get("uuid"), "daemon_device": src.memory["device"]}
    src.close()
    ctx.release()
    print(json.dumps(out), flush=True)


def main() -> None:
    role = sys.argv[1]
    if role == "source":
        source(sys.argv[2])
        return
    if role == "flow":
        flow(sys.argv[2], sys.argv[3], sys.argv[4])
        return
    sock = socket.socket(fileno=int(sys.argv[2]))
    if role == "exporter":
        exporter(sock)
    else:
        importer(sock, sys.argv[3])


if __name__ == "__main__":
    main()
