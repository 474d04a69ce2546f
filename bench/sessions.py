# SPDX-License-Identifier: Apache-2.0
"""N concurrent sessions on one daemon, one process each (shard k of N,
shuffled), reading EPOCHS epochs together: prints one JSON object with the
aggregate steady-state samples/s and the sessions' open times.

The steady state starts when the last session has its first batch: the
opens (which map and lock each session's batch memory) are reported apart,
not averaged into the rate. Batches a session read ahead before that moment
may be delivered after it; they are not counted (each session reads
prefetch_queue_depth batches ahead), so the rate is a lower bound."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time


def _rank(k: int, a: argparse.Namespace, ready, go, out) -> None:
    from nvfeed import LoaderSource
    ready.wait()
    go.wait()
    t0 = time.monotonic()
    with LoaderSource(a.dataset, socket=a.socket, batch_size=a.batch_size, shard_id=k, num_shards=a.sessions,
                      random_shuffle=True, seed=1, backend=a.backend, prefetch_queue_depth=a.prefetch,
                      zero_copy=True) as src:  # views, as measured
        opened = time.monotonic() - t0
        log = []  # (time delivered, samples, bytes) per batch
        for _ in range(a.epochs):
            for samples, _ in src:
                log.append((time.monotonic(), len(samples), sum(s.size for s in samples)))
        out.put((opened, log))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--dataset", default="train")
    ap.add_argument("--backend", default="gds")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--prefetch", type=int, default=2)
    a = ap.parse_args()
    ready, go, out = mp.Barrier(a.sessions + 1), mp.Barrier(a.sessions + 1), mp.Queue()
    procs = [mp.Process(target=_rank, args=(k, a, ready, go, out)) for k in range(a.sessions)]
    for p in procs:
        p.start()
    ready.wait()
    go.wait()
    res = [out.get() for _ in procs]
    for p in procs:
        p.join()
    start = max(log[0][0] for _, log in res)  # every session has had its first batch
    end = max(log[-1][0] for _, log in res)
    after = [(n, b) for _, log in res for t, n, b in log if t > start]
    n = sum(x[0] for x in after) - a.sessions * a.prefetch * a.batch_size  # read ahead before start
    nbytes = sum(x[1] for x in after) * n / max(1, sum(x[0] for x in after))
    secs = end - start
    print(json.dumps({"backend": f"{a.sessions} sessions {a.backend}", "samples": n, "bytes": int(nbytes), "seconds": secs,
                      "samples_per_s": n / secs, "bytes_per_s": nbytes / secs,
                      "open_s_median": statistics.median(o for o, _ in res), "open_s_max": max(o for o, _ in res)}))


if __name__ == "__main__":
    main()
