# SPDX-License-Identifier: Apache-2.0
"""The client's CPU per batch.

    python bench/client_cost.py SOCKET BATCH BATCHES BACKEND
        LoaderSource against a running loaderd (dataset "train"): wall time
        and the client's user and system CPU per batch, as JSON.
    python bench/client_cost.py --synthetic BATCH [numpy|dali]
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
from nvfeed._options import SourceOptions
from nvfeed._session import Session
from nvfeed._stream import Stream
from nvfeed._transport import Transport
from nvfeed._views import DaliTypes, Mapped


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


def synthetic(bs: int, fmt: str = "numpy", n: int = 20000) -> None:
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
    a.settimeout(5.0)  # as a session's stream has
    st = Stream.__new__(Stream)
    st._sock, st._buf = a, bytearray()
    buf = np.zeros(bs * 114688 * 6, np.uint8)
    dali = DaliTypes() if fmt == "dali" else None
    # A session past its open, on this stream (what Session._open sets).
    s = Session.__new__(Session)
    s.__dict__.update(id="synthetic", expect=(0, 0), gpu=None, mapped=Mapped(None, buf, None, dali), _fence=None,
                      _held=collections.deque(), _give_back=[], release_after=3, prefetch_queue_depth=2,
                      epoch_batches=0, components=0, reader="file", skipped_at_open=(0, ()), _dali=dali)
    s.transport = Transport("stream", "synthetic", 5.0, None)  # type: ignore[arg-type]
    s.transport._stream = st
    o = SourceOptions.check("synthetic", socket="synthetic", batch_size=bs, zero_copy=True,
                            batch_format="dali" if dali else "numpy")
    src = LoaderSource.__new__(LoaderSource)
    src.__dict__.update(options=o, _session=s, _dtypes={}, _last=None, last_indices=[], _lifetime=Lifetime(True),
                        _dali_looked=True, keep=None, skipped_samples=0, _skip_told=-1)
    for _ in range(10):
        next(src)
    print(json.dumps({"batch": bs, "synthetic": True, "format": fmt, **_cpu(lambda: next(src), n)}))
    a.close()


if __name__ == "__main__":
    if sys.argv[1] == "--synthetic":
        synthetic(int(sys.argv[2]), *sys.argv[3:4])
    else:
        live(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
