# SPDX-License-Identifier: Apache-2.0
"""Runs fio on a replay log of the loader's reads and prints one JSON
object in loaderd bench's shape: samples is the number of samples those
reads delivered (given), bytes what fio read from the device."""

from __future__ import annotations

import argparse
import json
import subprocess


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iolog", required=True)
    ap.add_argument("--samples", type=int, required=True)
    ap.add_argument("--iodepth", type=int, default=32)
    ap.add_argument("--ioengine", default="io_uring")
    ap.add_argument("--fixedbufs", action="store_true",
                    help="io_uring: register the buffers once (--fixedbufs; fio 3.33 refuses --registerfiles with a"
                         " replayed log: 'registered files require nr_files to be identical to open_files')")
    a = ap.parse_args()
    extra = ["--fixedbufs"] if a.fixedbufs else []
    out = subprocess.run(["fio", "--name=replay", f"--read_iolog={a.iolog}", "--replay_no_stall=1", "--direct=1",
                          f"--ioengine={a.ioengine}", f"--iodepth={a.iodepth}", "--output-format=json", *extra],
                         check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    secs = job["job_runtime"] / 1000
    nbytes = job["read"]["io_bytes"]
    print(json.dumps({"backend": "fio", "samples": a.samples, "bytes": nbytes, "seconds": secs,
                      "samples_per_s": a.samples / secs, "bytes_per_s": nbytes / secs,
                      "cpu_seconds": (job["usr_cpu"] + job["sys_cpu"]) / 100 * secs}))


if __name__ == "__main__":
    main()
