# SPDX-License-Identifier: Apache-2.0
"""Writes bench/RESULTS.md from what `make bench` printed (bench/out/):
the current tables only, each under the command that made it. The
decisions those figures fed, and the side-by-side measurements behind
them, are in docs/decisions.md.

Usage: python3 bench/results.py OUTDIR > bench/RESULTS.md"""

from __future__ import annotations

import datetime
import re
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rounds import Figure, parse_figure, verdict  # noqa: E402  (bench/ is no package)

# (file in OUTDIR, heading, the command make bench ran, what the table is)
SECTIONS = [
    ("run.txt", "Read throughput: every backend, Python, DALI and fio", "bash bench/run.sh $ROUNDS",
     "12 000 ImageNet-shaped files (lognormal around 110 KB), ext4 on a loop device attached with "
     "`--direct-io=on`, over a file on the VM's virtio disk and over a file in `/dev/shm` (RAM-backed: "
     "an NVMe stand-in that exposes software overhead). Batches of 64, shuffled, every case cold "
     "(`sync; echo 3 > /proc/sys/vm/drop_caches`) unless marked warm; medians of ROUNDS rounds (5 unless `make bench` was given ROUNDS) in one run, interleaved. "
     "The device limit is fio's best on the same bytes (every raw sample's extents, shuffled)."),
    ("node.txt", "A training node's shape: 8 ranks at once, beside fio", "bash bench/node.sh $ROUNDS",
     "12 000 ImageNet-shaped files on the RAM-backed ext4 loop device (`--direct-io=on`). 8 processes as the "
     "unprivileged user `nobody` in the daemon's socket group (socket mode 0660, the freshness guard and the "
     "access checks on, as deployed), one `LoaderSource` each (shard r of 8, no backend named), opened, then from "
     "a barrier reading 3 shuffled epochs at once, cold; at batch 64 and at batch 16. fio's best replay of the "
     "same bytes (every sample's extents, 3 epochs each shuffled anew) at the same total queue depth (8 x 32), with "
     "and without registered buffers. CPU per sample: the daemon's utime+stime and the clients' getrusage over "
     "the reading; fio's own beside it. Medians of ROUNDS interleaved rounds, [min-max]; the ratio round by round."),
    ("e2e-ram-operator.txt", "End to end, RAM device, bytes to an operator", "CONSUME=operator bash bench/e2e.sh ram $ROUNDS",
     "DALI CPU pipelines (`num_threads=2`) reading one epoch, the bytes handed to an operator as a decoder "
     "takes them. The ceiling is `fn.external_source` over the same files already in memory, fed as "
     "`LoaderSource` feeds DALI; \"ceiling, cold\" counts its reading of the files, cold; loader and "
     "reader cases are cold."),
    ("e2e-ram-output.txt", "End to end, RAM device, bytes returned", "bash bench/e2e.sh ram $ROUNDS",
     "The same, the bytes returned from the pipeline (DALI copies every byte to make its outputs "
     "contiguous: a cost of a read-only benchmark, not of training)."),
    ("e2e-virtio-operator.txt", "End to end, virtio device, bytes to an operator",
     "CONSUME=operator bash bench/e2e.sh virtio $ROUNDS", "As above, on the virtio disk: the disk is every reader's limit."),
    ("tensors.txt", "Tensors: .npy files into pinned memory, loaderd vs fn.readers.numpy, np.load and fio",
     "TOTAL_MB=1024 bash bench/tensors.sh $ROUNDS",
     "`.npy` files made by `np.save` (float32, 256 KiB: 256x256, and 16 MiB: 2048x2048; 1 GiB of data each), "
     "mapped with `mkbmap --reader numpy`, each size on its own ext4 loop device (`--direct-io=on`) over the "
     "virtio disk and over `/dev/shm`. One shuffled epoch per case, cold (page cache dropped before each), the "
     "case order reversed every other round, medians of ROUNDS rounds: `loaderd bench` into its pinned batch memory "
     "(gds, file, file --direct), a DALI pipeline of `fn.readers.numpy` alone (CPU, `num_threads=2`; with and "
     "without `use_o_direct`), an `np.load` loop, fio replaying every tensor's data extents (best of the "
     "settings shown: the device's limit), and the same 1 MiB reads by 4 threads into a 4 MiB destination "
     "(like fio's buffers, which stay in the CPU's cache) or a loader-sized 512 MiB one (`bench/pread_ring.py`). "
     "Goals (RAM device, 16 MiB tensors): loaderd gds >= 1.5x `fn.readers.numpy` and >= 0.9x fio best; why gds "
     "stays under fio's best there: [docs/decisions.md](../docs/decisions.md#why-gds-stays-under-fios-best-on-"
     "the-ram-device). The VM is shared (2 cores; other work ran beside it): single rounds are noisy, the spread "
     "column says how much."),
    ("wds.txt", "WebDataset: shuffle quality and cold throughput", "bash bench/wds.sh $WDS_ROUNDS",
     "Tar shards written class after class (`bench/wds_dataset.py`: 100 classes; each sample a `.jpg`, a `.cls` "
     "and a `.idx`, its stored position). Throughput: 6 000 samples of ~110 KB `.jpg` in shards of 500, ext4 on a "
     "loop device (`--direct-io=on`) over the virtio disk and over `/dev/shm`, one epoch of `.jpg` and `.cls` at "
     "batch 64, cold (page cache dropped after modules load and DALI's pipeline is built): loaderd's global "
     "permutation (gds) through `LoaderSource` and through `nvfeed.dali.reader` in a DALI pipeline "
     "(`num_threads=2`), `fn.readers.webdataset` reading in order (its fast case; `num_threads=2`), and "
     "`webdataset.WebDataset` with `shardshuffle` and `shuffle(1000)` under `DataLoader(num_workers=2)`. "
     "Quality: 30 000 samples of 16 bytes, 300 a class (RAM device; the share DALI's and webdataset's buffers leave grows with the samples a class: at 1 000 a class, 100 000 samples, `fn.readers.webdataset`'s default gave 0.79), one epoch's order per reader: the mean share of a "
     "batch of 64 drawn from its two most frequent classes (uniform: about 0.10), the share of batches with 80 % "
     "or more from two classes, and the largest and mean distance a sample moves from its stored position, as a "
     "fraction of the dataset; loaderd's `shuffle=\"dali\"` is checked equal to `fn.readers.webdataset`'s order."),
    ("table.txt", "The README's swap, CPU per sample, session opens", "bash bench/table.sh $ROUNDS",
     "2 000 real JPEGs (`bench/swap.py --make`) and 64 `.npy` files of 16 MiB, ext4 on a loop device "
     "(`--direct-io=on`) over `/dev/shm` and over the virtio disk. The README's swap as written "
     "(`nvfeed.dali.reader`, no backend named: the daemon's default, which the table names) against "
     "`fn.readers.file`, and the swap naming backend `file`: one DALI CPU pipeline each (`num_threads=2`, batch 64), "
     "one epoch, cold, timed from the pipeline's definition (build and session open included), the bytes to "
     "an operator or decoded by `fn.decoders.image`. CPU per sample: a `LoaderSource` alone reading 3 epochs, "
     "the daemon's utime+stime and the client's. Session open: `LoaderSource` over the `.npy` files, the first "
     "open after the daemon started and the median of 6 more."),
    ("scale.txt", "Start-up at ImageNet scale", "N=${BENCH_SCALE_N:-1281167} bash bench/scale.sh $ROUNDS",
     "1 281 167 files (unless `BENCH_SCALE_N` says fewer: the first line says how many) of ~2 KB on an ext4 "
     "loop device over the virtio disk, cold: `mkbmap`, the daemon ready (its map verification included), "
     "8 ranks' first batches (each rank's open and first batch, timed from its asking)."),
    ("lifetime.txt", "A batch's lifetime in a plain loop: copies against views", "bash bench/lifetime_cost.sh 15",
     "One daemon serves 3 000 ImageNet-shaped files and 1 000 float32 256x256 `.npy` files from a RAM-backed ext4 "
     "loop device (`--direct-io=on`), warm page cache, backend `gds`. A plain Python loop over "
     "`LoaderSource(random_shuffle=True)`: copies (the default outside DALI) against views (`zero_copy=True`), "
     "3 epochs a case and round, alternating; medians of the rounds. CPU per batch is the steadier figure."),
    ("dalipad.txt", "The DALI swap without pad_last_batch", "bash bench/dali_pad_cost.sh 5",
     "The README's swap (`bench/swap.py`, one DALI CPU pipeline, bytes to an operator) with and without "
     "`pad_last_batch`, beside `fn.readers.file`: 3 000 ImageNet-shaped files on a RAM-backed ext4 loop device, "
     "warm, batch 64, the four cases alternating, medians of the rounds. Unpadded, DALI's readers fill an "
     "epoch's last batch from the next epoch, and the swap copies each sample once to build such batches."),
    ("go-bench.txt", "Hot paths (go test -bench)", "go test -run XXX -bench . -benchtime 3x ./bmap/ ./loader/",
     "Map building and loading at scale, planning, the sampler."),
]

# The ROI benchmark (bench/roi.sh), kept apart from the list above: its
# table goes before the Go hot paths.
ROI_SECTION = (
    "roi.txt", "Regions of interest: crops and slices of .npy volumes against whole arrays", "bash bench/roi.sh $ROUNDS",
    "float32 volumes of 256x256x256 (64 MiB each) made by `np.save`, ext4 on a loop device over `/dev/shm` "
    "(`--direct-io=on`), read in one epoch (batch 4) whole, as a 64^3 crop (`roi_start`/`roi_end`), as one "
    "2-D slice along axis 0 (256 KiB contiguous) and along axis 1 (256 runs of 1 KiB, 256 KiB apart): "
    "`LoaderSource` through loaderd (gds, file) and `fn.readers.numpy` with the same arguments (CPU, "
    "`num_threads=2`, with and without mmap). Cold (page cache dropped before each case), medians of ROUNDS rounds; "
    "device: the loop device's bytes read while the epoch ran. Then the run-merge gap swept (nvfeed gds, "
    "loaderd built per gap).")
SECTIONS.insert(len(SECTIONS) - 1, ROI_SECTION)

# make bench's before and after, last.
SECTIONS.append((
    "baseline.txt", "Before and after: this tree against the baseline commit",
    "bash bench/baseline.sh $BENCH_BASELINE $ROUNDS",
    "`make bench`'s before and after, side by side in one run: the baseline commit (first line; the Makefile's "
    "`BENCH_BASELINE`, by default the last commit before the loader's plan, the one backend contract and the "
    "client's split) exported and built apart, against this tree. `loaderd bench` gds, bam and file, cold, the "
    "order alternating every round, on the RAM and virtio devices (12 000 ImageNet-shaped files; the ratio of an "
    "`after-` case is to its `before-` case); then each version's daemon read by its own Python client "
    "(`LoaderSource` in a CPU DALI pipeline, batch 64, bytes to an operator), RAM device. Within noise: a ratio "
    "inside the spread of the rounds."))


LOG = re.compile(r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d (DEBUG|INFO|WARN|ERROR) .*$")


def clean(text: str) -> list[str]:
    """The printed lines without progress and log lines (a log line that
    cut a benchmark's result line in two is taken out and the line
    joined)."""
    out: list[str] = []
    for line in text.splitlines():
        line = LOG.sub("", line).rstrip()
        if not line or line.startswith(("gendataset:", "e2e: ", "round ", '{"case"', "step: ")):  # wds.sh's rows: its table has them
            continue
        if out and re.fullmatch(r"Benchmark\S+", out[-1]):
            out[-1] += "\t" + line.strip()
            continue
        out.append(line)
    return out


def step(text: str) -> str:
    """What the Makefile's bench_step wrote around a step's output: the
    commit it ran on, when it started and how long it took."""
    m = re.search(r"^step: commit (\S+), started (\S+)", text, re.M)
    took = re.search(r"^step: took (\d+) s", text, re.M)
    if not m:
        return ""
    return f"Ran on commit {m[1]} from {m[2]}" + (f", {int(took[1]) // 60} min {int(took[1]) % 60} s." if took else ", unfinished.")


def section(out: Path, name: str, heading: str, command: str, what: str) -> None:
    """Prints one table's section: heading, command, what it is, the table."""
    p = out / name
    print(f"## {heading}\n")
    print(f"`{command}`\n")
    print(what + "\n")
    if not p.exists():
        print("(not run)\n")
        return
    ran = step(p.read_text())
    if ran:
        print(ran + "\n")
    print("```")
    print("\n".join(clean(p.read_text())).strip())
    print("```\n")


def _find(text: str, pattern: str, after: str = "") -> Figure | None:
    """The first number pattern's group captures in text (past the
    line that starts with after, if given), with the spread its step
    printed right after it (bench/rounds.py's form; rounds 0 when none);
    None when absent."""
    if after:
        i = text.find(after)
        if i < 0:
            return None
        text = text[i:]
    m = re.search(pattern, text, re.M)
    if not m:
        return None
    v = float(m.group(1))
    end = text.find("\n", m.start(1))
    f = parse_figure(text[m.start(1):end if end >= 0 else len(text)])
    return f if f and f.median == v else Figure(v, v, v, 0)


def _read(out: Path, name: str) -> str:
    p = out / name
    return p.read_text() if p.exists() else ""


def goals(out: Path) -> list[tuple[str, Figure | None, str, str, float, str, str]]:
    """The project's table of goals, row by row: (row, value, unit, op,
    target, the step that measured it, a note), value None where its step
    did not run or printed no such figure."""
    table, scale, run = _read(out, "table.txt"), _read(out, "scale.txt"), _read(out, "run.txt")
    e2e, tensors = _read(out, "e2e-ram-operator.txt"), _read(out, "tensors.txt")
    rows = []
    for dev, goal in (("ram", 1.5), ("virtio", 1.0)):
        for what in ("reader only", "with decode"):
            v = _find(table, rf"^goal: {dev}: swap vs readers.file, {what}: ([\d.]+)")
            rows.append((f"the README's swap (default backend) vs `fn.readers.file`, {what}, 2 000 JPEGs, "
                         f"build and open included, {dev} device", v, "x", ">=", goal, "table.txt", ""))
    nf = _find(scale, r"^files: (\d+)")
    n = int(nf.median) if nf else 1281167
    files = f"{n:,}".replace(",", " ") + " files" + ("" if n == 1281167 else " (BENCH_SCALE_N: the goals are for 1 281 167)")
    rows += [
        (f"{files}: `mkbmap`, cold", _find(scale, r"^mkbmap cold: ([\d.]+) s"), " s", "<", 15, "scale.txt", ""),
        (f"{files}: the daemon ready, cold", _find(scale, r"median daemon ready \(cold\): ([\d.]+)"), " s", "<", 5,
         "scale.txt", ""),
        (f"{files}: 8 ranks' first batch (the slowest of a round)",
         _find(scale, r"median 8 ranks' first batch \(the slowest of a round\): ([\d.]+)"), " s", "<", 0.5,
         "scale.txt", ""),
    ]
    for dev in ("ram", "virtio"):
        rows.append((f"session open, gds, 64 x 16 MiB `.npy`, {dev} device (the first or the median, the larger)",
                     _find(table, rf"^goal: {dev}: session open, gds, npy: ([\d.]+) ms"), " ms", "<", 50, "table.txt", ""))
    rows.append(("`external_source(LoaderSource gds)` vs DALI fed the same bytes from RAM, batch 64",
                 _find(e2e, r"^LoaderSource gds vs ceiling, batch 64: ([\d.]+)"), "x", ">=", 0.9,
                 "e2e-ram-operator.txt", "the loader cold, the ceiling warm"))
    rows.append(("`external_source(LoaderSource gds)` vs DALI fed the same bytes from RAM, batch 64, both cold",
                 _find(e2e, r"^LoaderSource gds vs ceiling, cold, batch 64: ([\d.]+)"), "x", ">=", 0.9,
                 "e2e-ram-operator.txt", "the ceiling's reading of the files counted"))
    for bs in (16, 64):
        rows.append((f"`LoaderSource` vs `loaderd bench`, warm, batch {bs}, ram device",
                     _find(run, rf"LoaderSource vs loaderd bench, warm, batch {bs} \(>= 0.9\)\s+([\d.]+)",
                           "ram device: targets"), "x", ">=", 0.9, "run.txt", "backend file"))
    rows.append(("`gds` vs fio's best on the same bytes, ram device",
                 _find(run, r"gds vs fio best \(>= 0.95\)\s+([\d.]+)", "ram device: targets"), "x", ">=", 0.95,
                 "run.txt", ""))
    rows.append(("256 KiB tensors, ram device, `gds` vs fio's best",
                 _find(tensors, r"loaderd gds vs fio best \(>= 0.9\)\s+([\d.]+)", "ram device, 256 KiB tensors: goals"),
                 "x", ">=", 0.9, "tensors.txt", ""))
    node = _read(out, "node.txt")
    rows.append(("8 ranks at once (non-root, batch 64, 3 epochs) vs fio's best on the same bytes, ram device",
                 _find(node, r"^goal: node: 8 ranks, batch 64, vs fio best: ([\d.]+)"), "x", ">=", 0.9, "node.txt",
                 "the same total queue depth"))
    rows.append(("CPU per sample, daemon + clients, 8 ranks at once, batch 64, ram device",
                 _find(node, r"^goal: node: CPU per sample, daemon \+ clients, batch 64: ([\d.]+)"), " µs", "<=", 10,
                 "node.txt", "fio's own beside it in its table"))
    rows.append(("the same 8 ranks with huge pages reserved (`vm.nr_hugepages`) vs fio's best, ram device",
                 _find(node, r"^goal: node: 8 ranks, batch 64, huge pages, vs fio best: ([\d.]+)"), "x", ">=", 0.9,
                 "node.txt", "the deployment docs/daemon.md advises"))
    rows.append(("CPU per sample, daemon + clients, the same 8 ranks with huge pages reserved",
                 _find(node, r"^goal: node: CPU per sample, daemon \+ clients, batch 64, huge pages: ([\d.]+)"), " µs",
                 "<=", 10, "node.txt", ""))
    for dev in ("ram", "virtio"):
        rows.append((f"CPU per sample, daemon + client, {dev} device",
                     _find(table, rf"^goal: {dev}: CPU per sample, daemon \+ client: ([\d.]+)"), " µs", "<=", 5,
                     "table.txt", "a LoaderSource alone, default backend, batch 64, cold"))
    return rows


# Where a goal is missed, why: the profile that explains it and what it
# would take, in docs/decisions.md (row pattern, its section's anchor).
WHY = [
    (r"swap .*with decode", "the-swap-with-a-cpu-decoder"),
    (r"swap .*reader only", "the-swap-reader-only-on-the-ram-device"),
    (r"8 ranks at once|the same 8 ranks", "8-ranks-at-once-on-the-ram-device"),
    (r"^CPU per sample", "cpu-per-sample-daemon--client"),
    (r"`LoaderSource` vs `loaderd bench`", "loadersource-against-loaderd-bench-warm"),
    (r"^`external_source", "external_sourceloadersource-gds-against-dali-fed-from-ram"),
    (r"`mkbmap`, cold", "mkbmap-at-1-281-167-files"),
    (r"8 ranks' first batch", "8-ranks-first-batch-at-1-281-167-files"),
    (r"`gds` vs fio's best on the same bytes", "why-gds-stays-under-fios-best-on-the-ram-device"),
    (r"256 KiB tensors", "256-kib-tensors-gds-against-fios-best-ram-device"),
    (r"^session open, gds", "batch-slots-registered-off-the-open"),
]


def why(row: str) -> str:
    """A link to the section that explains why row's goal is missed, or ""."""
    for pattern, anchor in WHY:
        if re.search(pattern, row):
            return f"[why](../docs/decisions.md#{anchor})"
    return ""


def print_goals(out: Path) -> None:
    """The goals table: each row's figure, its goal and whether it is met."""
    print("## Goals\n")
    print("Every row of the project's table of goals, from the steps below (the last column names the")
    print("output it was read from); \"not run\" where that step did not run. A missed goal links to the profile")
    print("that explains it and what it would take.\n")
    print("A figure is the median of its step's interleaved rounds, its spread (min-max) in brackets; \"spread >")
    print("margin\" marks a row whose rounds' spread is wider than its distance to the goal (its verdict could flip")
    print("between identical runs), \"no spread\" one whose step printed a single figure.\n")
    print("| | now | goal | met | from |")
    print("|---|---|---|---|---|")
    for row, f, unit, op, target, src, note in goals(out):
        if f is None:
            now, met = "not run", ""
        else:
            digits = 1 if unit in (" ms", " µs") else 2
            now = f"{f.median:.{digits}f}{unit}"
            if f.rounds:
                now += f" [{f.lo:.{digits}f}-{f.hi:.{digits}f}]"
            words = verdict(f, op, target)
            if words.startswith("missed"):
                words = " ".join(filter(None, ["**missed**" + words.removeprefix("missed"), why(row)]))
            met = words
        note = f" ({note})" if note else ""
        print(f"| {row}{note} | {now} | {op.replace('>=', '≥').replace('<=', '≤')} {target:g}{unit} | {met} | `{src}` |")
    print()


def main() -> None:
    out = Path(sys.argv[1])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    when = datetime.datetime.fromtimestamp(max(p.stat().st_mtime for p in out.iterdir()), datetime.timezone.utc)
    print("# Figures\n")
    print(f"Written by `make bench` ({when:%Y-%m-%d}; `bench/results.py` at commit {commit} from `bench/out/`; each")
    print("step names the commit it ran on): the")
    print("current tables only, each under the command that made it, on this project's 2-core development")
    print(f"VM ({os.cpu_count()} CPUs here). What was chosen from measurements, and the side-by-side A/Bs behind")
    print("each choice: [docs/decisions.md](../docs/decisions.md). Run `make bench` to regenerate this file.\n")
    print_goals(out)
    for s in SECTIONS:
        section(out, *s)


if __name__ == "__main__":
    main()
