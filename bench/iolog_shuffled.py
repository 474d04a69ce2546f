# SPDX-License-Identifier: Apache-2.0
"""Writes a fio iolog (v2) that reads the same bytes as the raw backends
— every raw sample's extents (a tensor sample's: those of its data, not
its .npy header), rounded out to 4 KiB and split at 1 MiB (or
at --request with --blocks: whole fixed blocks, as bam asks) — with the
samples in a random order. Replayed by fio at its best queue depth it is
the device's limit for these bytes, independent of the loader's own order.
Reads the map as mkbmap's JSON (mkbmap inspect --format json)."""

from __future__ import annotations

import argparse
import json
import random


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--map-json", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--request", type=int, default=1 << 20, help="largest request (bytes)")
    ap.add_argument("--blocks", action="store_true", help="whole --request-sized, --request-aligned blocks (bam)")
    ap.add_argument("--epochs", type=int, default=1, help="read every sample this many times, each pass shuffled anew")
    a = ap.parse_args()
    m = json.load(open(a.map_json))
    dev = m["device"]["path"]
    raw = [s for s in m["samples"] if s["raw"]]
    rng = random.Random(a.seed)
    samples = []
    for _ in range(a.epochs):  # fio's --loops does not repeat a replayed log
        epoch = list(raw)
        rng.shuffle(epoch)
        samples += epoch
    with open(a.out, "w") as f:
        f.write(f"fio version 2 iolog\n{dev} add\n{dev} open\n")
        for s in samples:
            # The sample's bytes of the file: [offset, offset+size) (a
            # tensor sample's data after its .npy header; 0.. for a file).
            start = s.get("offset", 0)
            stop = start + s["size"]
            for e in s["extents"]:
                lo_l, hi_l = max(e["logical"], start), min(e["logical"] + e["length"], stop)
                if lo_l >= hi_l:
                    continue
                first = e["physical"] + (lo_l - e["logical"])
                end = e["physical"] + (hi_l - e["logical"])
                if a.blocks:
                    lo = first - first % a.request
                    for off in range(lo, end, a.request):
                        f.write(f"{dev} read {off} {a.request}\n")
                    continue
                lo, hi = first & ~4095, (end + 4095) & ~4095
                for off in range(lo, hi, a.request):
                    f.write(f"{dev} read {off} {min(a.request, hi - off)}\n")
        f.write(f"{dev} close\n")
    print(len(raw))


if __name__ == "__main__":
    main()
