# SPDX-License-Identifier: Apache-2.0
"""The client's CPU per batch.

    python bench/client_cost.py SOCKET BATCH BATCHES BACKEND
        LoaderSource against a running loaderd (dataset "train"): wall time
        and the client's user and system CPU per batch, as JSON.
    python bench/client_cost.py --synthetic BATCH
        No daemon: frames as loaderd sends them, written into a socketpair
        by a child process, through the source's own receive path (its
        release frames go back the same way): the Python cost alone.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import socket
import sys
import time

import msgpack
import numpy as np

from nvfeed import LoaderSource
from nvfeed._lifetime import Lifetime
from nvfeed._stream import Stream
from nvfeed._views import Mapped


def _cpu(f, n: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(n):
        f()
    dt, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_us": dt / n * 1e6, "user_us": (r1.ru_utime - r0.ru_utime) / n * 1e6,
            "sys_us": (r1.ru_stime - r0.ru_stime) / n * 1e6}


def live(sock: str, bs: int, n: int, backend: str) -> None:
    with LoaderSource("train", socket=sock, batch_size=bs, random_shuffle=True, backend=backend,
                      zero_copy=True) as src:  # views, as measured (bench/lifetime_cost.py: copies)
        def one() -> None:
            while True:
                try:
                    next(src)
                    return
                except StopIteration:
                    continue
        for _ in range(5):
            one()
        print(json.dumps({"batch": bs, "backend": backend, **_cpu(one, n)}))


def synthetic(bs: int, n: int = 20000) -> None:
    frames = [msgpack.packb({"end_of_epoch": False, "epoch": 0, "iteration": i, "epoch_batches": 1 << 30, "slot": i % 6,
                             "offsets": [k * 114688 for k in range(bs)], "lengths": [110000 + k for k in range(bs)],
                             "labels": [k % 100 for k in range(bs)], "indices": list(range(i * bs, i * bs + bs))})
              for i in range(n + 10)]
    blob = b"".join(len(f).to_bytes(4, "big") + f for f in frames)
    a, b = socket.socketpair()
    if os.fork() == 0:  # the "daemon": writes every frame, drains releases
        a.close()
        if os.fork() == 0:
            while b.recv(65536):
                pass
            os._exit(0)
        b.sendall(blob)  # then exits: the drainer's copy keeps the socket open
        os._exit(0)
    b.close()
    st = Stream.__new__(Stream)
    st._sock, st._buf = a, bytearray()
    # A source past its open, on this stream (what _open would have set).
    src = LoaderSource.__new__(LoaderSource)
    buf = np.zeros(bs * 114688 * 6, np.uint8)
    src.__dict__.update(_id="synthetic", _give_back=[], _held=collections.deque(), _release_after=3, _transport="stream",
                        _stream=st, _expect=(0, 0), _on_error="raise", _gpu=None, _dali=None, _epoch_batches=0,
                        _reconnect_timeout=0, _buf=buf, _mapped=Mapped(None, buf, None, None), _fence=None,
                        _dali_looked=True, _lifetime=Lifetime(True), _req={"dataset": "synthetic"}, keep=None, reader="file", prefetch_queue_depth=2,
                        components=None, _unsent=[])
    for _ in range(10):
        next(src)
    print(json.dumps({"batch": bs, "synthetic": True, **_cpu(lambda: next(src), n)}))
    a.close()


if __name__ == "__main__":
    if sys.argv[1] == "--synthetic":
        synthetic(int(sys.argv[2]))
    else:
        live(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
