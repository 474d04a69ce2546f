# SPDX-License-Identifier: Apache-2.0
"""The README's swap, as a user runs it: one DALI CPU pipeline reading one
epoch of a dataset of JPEGs with `fn.readers.file`, or with the one line
swapped for `nvfeed.dali.reader` (no backend named: the daemon's default;
--backend names one; --no-pad reads without pad_last_batch, where the
swap copies each sample once as DALI's reader fills a batch across an
epoch's end), timed from the pipeline's definition to the epoch's
last batch (pipeline build and, for the swap, the session's open
included). --decode adds `fn.decoders.image` (CPU) after the reader.
Prints one JSON object: samples, seconds, samples_per_s, the backend that
read and why, and this process's CPU seconds
(user + sys, from getrusage).

Also `--make DIR --files N`: writes N real JPEGs (random noise, ~110 KB,
in 10 class folders) for the decode case (gendataset's files are not
decodable). Needs DALI and, for the swap, a daemon serving the dataset
as "train" ($NVFEED_SOCKET or --socket).

Usage: python bench/swap.py CASE --datadir DIR [--socket S] [--batch 64] [--decode] [--backend B]
       python bench/swap.py --make DIR --files N
CASE: readers.file or swap"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time


def make(out: str, files: int) -> None:
    """Writes files real JPEGs under out/cNN/, each a different noise image."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(1)
    # Smooth noise compresses to about 110 KB at this size and quality.
    for i in range(files):
        d = os.path.join(out, f"c{i % 10:02d}")
        os.makedirs(d, exist_ok=True)
        small = rng.integers(0, 256, (94, 125, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((500, 375), Image.Resampling.BILINEAR)
        img.save(os.path.join(d, f"{i:06d}.jpg"), quality=90)


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(a: argparse.Namespace) -> dict:
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def
    if a.case == "swap":
        import nvfeed.dali  # imported at the top of a user's script, as DALI is: outside the clock
    n_files = sum(len(fs) for _, _, fs in os.walk(a.datadir))
    batches = (n_files + a.batch - 1) // a.batch
    c0, t0 = cpu(), time.perf_counter()

    @pipeline_def(batch_size=a.batch, num_threads=2, device_id=None, seed=12)
    def pipe():
        if a.case == "readers.file":
            jpegs, labels = fn.readers.file(file_root=a.datadir, random_shuffle=True, pad_last_batch=not a.no_pad,
                                            name="Reader")
        else:
            kw = {"backend": a.backend} if a.backend else {}
            jpegs, labels = nvfeed.dali.reader("train", random_shuffle=True, pad_last_batch=not a.no_pad, name="Reader",
                                               socket=a.socket, **kw)
        if a.decode:
            return fn.decoders.image(jpegs, device="cpu"), labels
        return jpegs.shape(), labels  # the bytes to an operator, as a decoder takes them (no copy)

    p = pipe()
    p.build()
    n = 0
    for _ in range(batches):
        out, _ = p.run()
        n += len(out)
    secs = time.perf_counter() - t0
    r = {"case": a.case, "decode": a.decode, "pad": not a.no_pad, "batch": a.batch, "samples": n, "seconds": secs, "samples_per_s": n / secs,
         "client_cpu_s": cpu() - c0}
    if a.case == "swap":
        from nvfeed import LoaderSource  # what the reader opened: asked of a source opened the same way
        kw = {"backend": a.backend} if a.backend else {}
        with LoaderSource("train", socket=a.socket, batch_size=a.batch, **kw) as s:
            r.update(backend=s.backend, backend_why=getattr(s, "backend_why", ""))  # "" from an older client
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", nargs="?", choices=["readers.file", "swap"])
    ap.add_argument("--datadir")
    ap.add_argument("--socket", default=None)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--decode", action="store_true")
    ap.add_argument("--no-pad", action="store_true",
                    help="pad_last_batch=False: epochs run into each other, as DALI's readers' do (the swap copies)")
    ap.add_argument("--backend", default=None, help="the swap's backend (default: none named, the daemon's choice)")
    ap.add_argument("--make", metavar="DIR")
    ap.add_argument("--files", type=int, default=2000)
    a = ap.parse_args()
    if a.make:
        make(a.make, a.files)
        return
    if not a.case or not a.datadir:
        ap.error("CASE and --datadir are needed")
    print(json.dumps(run(a)))


if __name__ == "__main__":
    main()
