# SPDX-License-Identifier: Apache-2.0
"""The device's limit into loader-sized memory: replays a fio iolog
(bench/iolog_shuffled.py) with O_DIRECT preads from QD threads, each
read landing at the next place of a destination ring of FOOTPRINT MiB
(each thread its own part), as a loader's batches land in distinct
memory. fio replays into iodepth x request bytes of buffers (4 MiB at
queue depth 4), which stay in the CPU's cache: on a RAM-backed loop
device the kernel's copy into them is cheaper than into memory that must
be written back (bench/RESULTS.md, the tensor profile). Prints one JSON
object in loaderd bench's shape.

Usage: python bench/pread_ring.py --iolog LOG --samples N [--iodepth 4] [--footprint 512]"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import threading
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iolog", required=True)
    ap.add_argument("--samples", type=int, required=True, help="tensors the log reads (reported, not counted)")
    ap.add_argument("--iodepth", type=int, default=4, help="threads, each with one read in flight")
    ap.add_argument("--footprint", type=int, default=512, help="destination ring (MiB)")
    a = ap.parse_args()
    dev, reads = None, []
    with open(a.iolog) as f:
        for line in f:
            p = line.split()
            if len(p) == 4 and p[1] == "read":
                dev = p[0]
                reads.append((int(p[2]), int(p[3])))
    if dev is None:
        raise SystemExit(f"pread_ring: {a.iolog}: no reads")
    part = a.footprint * 2**20 // a.iodepth // 4096 * 4096
    if part < max(n for _, n in reads):
        raise SystemExit(f"pread_ring: --footprint {a.footprint} MiB: each of {a.iodepth} parts is smaller than a read")
    buf = mmap.mmap(-1, part * a.iodepth)
    buf.write(b"\1" * len(buf))  # fault every page in before the clock
    view = memoryview(buf)
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    lock, nxt = threading.Lock(), [0]

    def work(k: int) -> None:
        pos, base = 0, k * part
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(reads):
                return
            off, n = reads[i]
            if pos + n > part:
                pos = 0
            if os.preadv(fd, [view[base + pos:base + pos + n]], off) != n:
                raise SystemExit(f"pread_ring: short read at {off}")
            pos += n

    c0 = os.times()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(k,)) for k in range(a.iodepth)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.perf_counter() - t0
    c1 = os.times()
    os.close(fd)
    nbytes = sum(n for _, n in reads)
    print(json.dumps({"backend": "pread-ring", "samples": a.samples, "bytes": nbytes, "seconds": secs,
                      "samples_per_s": a.samples / secs, "bytes_per_s": nbytes / secs,
                      "cpu_seconds": (c1.user - c0.user) + (c1.system - c0.system)}))


if __name__ == "__main__":
    main()
