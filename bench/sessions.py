# SPDX-License-Identifier: Apache-2.0
"""N concurrent sessions on one daemon, one process each (shard k of N,
shuffled), reading EPOCHS epochs together: prints one JSON object with the
aggregate steady-state samples/s and the sessions' open times.

The steady state starts when the last session has its first batch: the
opens (which map and lock each session's batch memory) are reported apart,
not averaged into the rate. Batches a session read ahead before that moment
may be delivered after it; they are not counted (each session reads
prefetch_queue_depth batches ahead), so the rate is a lower bound.

With --open-first (a training node's shape, bench/node.sh) each session
opens first and the barrier comes after: the rate is timed from the
barrier, every batch counted but the read-ahead; the CPU of that window
is reported too, per sample and per batch: the daemon's (utime + stime
of /proc/PID/stat, --daemon-pid) and the sessions' own (getrusage).

With more than one epoch it also reports the rate after the first epoch
(every batch delivered after half the ranks began their second), which
leaves out what a session pays once: its memory's first use and each
sample's first access check; and the CPU per sample after it, the
daemon's from a trace of its CPU every 5 ms, the clients' from each one's
second epoch."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import threading
import time

from loader_cpu import daemon_cpu, own_cpu


def _rank(k: int, a: argparse.Namespace, ready, go, out) -> None:
    from nvfeed import LoaderSource
    kw = {"backend": a.backend} if a.backend else {}  # "": the daemon's default
    if a.backend_options:
        kw["backend_options"] = json.loads(a.backend_options)
    if not a.open_first:
        ready.wait()
        go.wait()
    t0 = time.monotonic()
    with LoaderSource(a.dataset, socket=a.socket, batch_size=a.batch_size, shard_id=k, num_shards=a.sessions,
                      random_shuffle=True, seed=1, prefetch_queue_depth=a.prefetch,
                      zero_copy=True, **kw) as src:  # views, as measured
        opened = time.monotonic() - t0
        if a.open_first:
            ready.wait()
            go.wait()
        c0 = own_cpu()
        log = []  # (time delivered, samples, bytes) per batch
        firsts, cpus = [], []  # where each epoch's batches start in log, and the CPU used before it
        for _ in range(a.epochs):
            firsts.append(len(log))
            cpus.append(own_cpu() - c0)
            for samples, _ in src:
                log.append((time.monotonic(), len(samples), sum(s.size for s in samples)))
        out.put((opened, log, own_cpu() - c0, src.backend, firsts, cpus))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--dataset", default="train")
    ap.add_argument("--backend", default="gds", help='"": none named, the daemon\'s default')
    ap.add_argument("--backend-options", default="", help="JSON: the sessions' backend_options")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--open-first", action="store_true", help="open every session, then read from a barrier")
    ap.add_argument("--daemon-pid", type=int, default=0, help="with --open-first: report the daemon's CPU too")
    a = ap.parse_args()
    ready, go, out = mp.Barrier(a.sessions + 1), mp.Barrier(a.sessions + 1), mp.Queue()
    procs = [mp.Process(target=_rank, args=(k, a, ready, go, out)) for k in range(a.sessions)]
    for p in procs:
        p.start()
    ready.wait()
    d0 = daemon_cpu(a.daemon_pid) if a.daemon_pid else 0.0
    go.wait()
    t_go = time.monotonic()
    # The daemon's CPU through the reading, every 5 ms: its share after
    # the first epoch is read off this.
    trace, reading = [], threading.Event()
    reading.set()

    def sample() -> None:
        while reading.is_set():
            trace.append((time.monotonic(), daemon_cpu(a.daemon_pid)))
            time.sleep(0.005)
    tracer = threading.Thread(target=sample, daemon=True)
    if a.daemon_pid:
        tracer.start()
    res = [out.get() for _ in procs]
    reading.clear()
    d1 = daemon_cpu(a.daemon_pid) if a.daemon_pid else 0.0
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"sessions: a session exited with {p.exitcode}")
    ahead = a.sessions * a.prefetch * a.batch_size  # read ahead before start: not counted
    # Open first: from the barrier. Else: once every session has had its first batch.
    start = t_go if a.open_first else max(log[0][0] for _, log, *_ in res)
    end = max(log[-1][0] for _, log, *_ in res)
    after = [(n, b) for _, log, *_ in res for t, n, b in log if t > start]
    n = sum(x[0] for x in after) - ahead
    if n <= 0:
        raise SystemExit(f"sessions: {n + ahead} samples read, no more than the {ahead} read ahead: too few to time")
    nbytes = sum(x[1] for x in after) * n / max(1, sum(x[0] for x in after))
    secs = end - start
    # After the first epoch: from when half the ranks had their second
    # epoch's first batch, every batch delivered after it.
    if a.epochs > 1:
        t1 = statistics.median(log[f[1]][0] for _, log, _, _, f, _ in res)
        later = sum(n for _, log, *_ in res for t, n, _ in log if t > t1)
        steady = {"after_first_epoch_samples_per_s": later / (end - t1)}
        # CPU per sample after the first epoch: the clients' from each
        # one's second epoch on, the daemon's from t1 (its trace).
        own = sum(log_cpu - cpus[1] for _, _, log_cpu, _, _, cpus in res)
        own_n = sum(n for _, log, _, _, f, _ in res for _, n, _ in log[f[1]:])
        steady["after_first_epoch_clients_us"] = own / own_n * 1e6
        if a.daemon_pid and trace:
            def daemon_at(when: float) -> float:  # the daemon's CPU at the first trace point from when on
                return next((c for t, c in trace if t >= when), d1)
            steady["after_first_epoch_daemon_us"] = (d1 - daemon_at(t1)) / later * 1e6
            # Epoch by epoch (from when half the ranks began it): the daemon's CPU a sample.
            bounds = [start] + [statistics.median(log[f[e]][0] for _, log, _, _, f, _ in res)
                                for e in range(1, a.epochs)] + [end]
            cpu_at = [daemon_at(b) for b in bounds]
            steady["daemon_us_by_epoch"] = [
                round((cpu_at[e + 1] - cpu_at[e]) * 1e6 / max(1, sum(
                    n for _, log, *_ in res for t, n, _ in log if bounds[e] < t <= bounds[e + 1])), 1)
                for e in range(a.epochs)]
    else:
        steady = {}
    r = {"backend": f"{a.sessions} sessions {res[0][3]}", "samples": n, "bytes": int(nbytes), "seconds": secs,
         "samples_per_s": n / secs, "bytes_per_s": nbytes / secs,
         "open_s_median": statistics.median(o for o, *_ in res), "open_s_max": max(o for o, *_ in res),
         "rank_ends_s": sorted(round(log[-1][0] - start, 3) for _, log, *_ in res), **steady}
    if a.open_first:
        # Per the samples and batches counted in the rate: the read-ahead,
        # likely read before the window, is left out (an upper bound).
        batches = sum(len(log) for _, log, *_ in res) - a.sessions * a.prefetch
        clients = sum(c for _, _, c, *_ in res)
        r.update(batches=batches, clients_cpu_s=clients, clients_us=clients / n * 1e6,
                 clients_us_per_batch=clients / batches * 1e6)
        if a.daemon_pid:
            r.update(daemon_cpu_s=d1 - d0, daemon_us=(d1 - d0) / n * 1e6,
                     daemon_us_per_batch=(d1 - d0) / batches * 1e6)
    print(json.dumps(r))


if __name__ == "__main__":
    main()
