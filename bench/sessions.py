"""N concurrent sessions on one daemon, one process each (shard k of N,
shuffled), reading one epoch together: prints one JSON object with the
aggregate samples/s, timed from when every session is open."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time


def _rank(k: int, a: argparse.Namespace, ready, go, out) -> None:
    from dali_source import LoaderSource
    with LoaderSource(a.dataset, socket=a.socket, batch_size=a.batch_size, shard_id=k, num_shards=a.sessions,
                      random_shuffle=True, seed=1, backend=a.backend) as src:
        ready.wait()
        go.wait()
        n = nbytes = 0
        for samples, _ in src:
            n += len(samples)
            nbytes += sum(s.size for s in samples)
        out.put((n, nbytes, time.monotonic()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--dataset", default="train")
    ap.add_argument("--backend", default="gds")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=64)
    a = ap.parse_args()
    ready, go, out = mp.Barrier(a.sessions + 1), mp.Barrier(a.sessions + 1), mp.Queue()
    procs = [mp.Process(target=_rank, args=(k, a, ready, go, out)) for k in range(a.sessions)]
    for p in procs:
        p.start()
    ready.wait()
    t0 = time.monotonic()
    go.wait()
    res = [out.get() for _ in procs]
    for p in procs:
        p.join()
    n, nbytes, secs = sum(r[0] for r in res), sum(r[1] for r in res), max(r[2] for r in res) - t0
    print(json.dumps({"backend": f"{a.sessions} sessions {a.backend}", "samples": n, "bytes": nbytes, "seconds": secs,
                      "samples_per_s": n / secs, "bytes_per_s": nbytes / secs}))


if __name__ == "__main__":
    main()
