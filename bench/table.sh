#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The rows of the project's table that no other step of `make bench`
# measures, on each device (RAM-backed and virtio ext4 loop devices,
# --direct-io=on), side by side in one run:
#  - the README's swap as written (nvfeed.dali.reader, no backend named:
#    the daemon's default) against fn.readers.file, and the swap naming
#    backend file: FILES real JPEGs (bench/swap.py --make), one DALI CPU
#    pipeline (num_threads=2, batch 64) per case, one epoch, cold, timed
#    from the pipeline's definition (pipeline build and session open
#    included); reader only (the bytes to an operator) and with
#    fn.decoders.image;
#  - CPU per sample, daemon + client: a LoaderSource alone (no backend
#    named, no DALI) reading 3 shuffled epochs, cold, the daemon's
#    utime + stime (/proc/PID/stat) and the client's (getrusage) over the
#    reading, per sample (bench/loader_cpu.py cpu);
#  - session open time over NPY (default 64) 16 MiB .npy files
#    (bench/npy_dataset.py), backend gds and file: the first open after the
#    daemon started and the median of 6 more (bench/loader_cpu.py open).
# Every case is cold (sync; drop_caches) but the later opens; the case
# order is reversed every other round; medians of ROUNDS with their spread
# (bench/rounds.py). The summary's "goal" lines are read by
# bench/results.py.
#
# Needs root and DALI. Usage: bench/table.sh [ROUNDS]
# (env: DEVICES, default "ram virtio"; FILES, default 2000; NPY, default 64)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
. bench/lib.sh
trap bench_cleanup EXIT
py=.venv/bin/python
mkdir -p .bench; out=$PWD/.bench/table.jsonl
: > "$out"
for device in ${DEVICES:-ram virtio}; do
  bench_device "$device" "$PWD/.bench/table-$device" 3G
  w=$bench_work
  $py bench/swap.py --make "$w/mnt/train" --files "${FILES:-2000}"
  $py bench/npy_dataset.py --out "$w/mnt/npy" --files "${NPY:-64}" --shape 2048,2048 >/dev/null
  sync
  bin/mkbmap --mountpoint "$w/mnt/train" -o "$w/train.bmap" 2>/dev/null
  bin/mkbmap --reader numpy --mountpoint "$w/mnt/npy" -o "$w/npy.bmap" 2>/dev/null
  drop
  bench_serve "$w/d.sock" "$w/loaderd.log" --dataset "train=$w/train.bmap" --dataset "npy=$w/npy.bmap"
  d=$bench_daemon
  tag() { $py -c 'import json,sys; r=json.loads(sys.stdin.read()); r.update(device=sys.argv[1], label=sys.argv[2], round=int(sys.argv[3])); print(json.dumps(r))' "$device" "$1" "$r" >> "$out"; }
  r=0  # the opens: once, before the rounds
  for b in gds file; do $py bench/loader_cpu.py open --socket "$w/d.sock" --dataset npy --backend "$b" | tag "open $b"; done
  cases=("readers.file|readers.file" "swap|swap" "swap, backend file|swap --backend file"
         "readers.file + decode|readers.file --decode" "swap + decode|swap --decode" "swap, backend file + decode|swap --backend file --decode")
  for r in $(seq 1 "$rounds"); do
    order=("${cases[@]}")
    if (( r % 2 == 0 )); then order=(); for ((i = ${#cases[@]} - 1; i >= 0; i--)); do order+=("${cases[i]}"); done; fi
    for c in "${order[@]}"; do
      IFS='|' read -r label args <<<"$c"
      drop
      read -r du0 ds0 < <(awk '{print $14, $15}' "/proc/$d/stat")
      # shellcheck disable=SC2086 # args are the case's flags
      r_json=$($py bench/swap.py $args --datadir "$w/mnt/train" --socket "$w/d.sock")
      read -r du1 ds1 < <(awk '{print $14, $15}' "/proc/$d/stat")
      $py -c 'import json,os,sys; r=json.loads(sys.argv[1]); r["daemon_cpu_s"]=(int(sys.argv[2])-int(sys.argv[3]))/os.sysconf("SC_CLK_TCK"); print(json.dumps(r))' \
        "$r_json" "$((du1 + ds1))" "$((du0 + ds0))" | tag "$label"
    done
    drop
    $py bench/loader_cpu.py cpu --socket "$w/d.sock" --dataset train --pid "$d" | tag "cpu per sample"
    echo "table: $device: round $r of $rounds done" >&2
  done
  bench_cleanup
done
$py - "$out" <<'PY'
import json, statistics, sys
sys.path.insert(0, "bench")
from rounds import by_round, figure, goal_line, ratio
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda xs: statistics.median(xs) if xs else float("nan")
for dev in dict.fromkeys(r["device"] for r in rows):
    rs = [r for r in rows if r["device"] == dev]
    by = {}
    for r in rs:
        by.setdefault(r["label"], []).append(r)
    sw = by["swap"][0]
    print(f"\n{dev} device: DALI CPU pipeline (num_threads=2, batch 64), {sw['samples']} JPEGs, one epoch, cold, "
          f"pipeline build and session open included; medians of {len(by['swap'])} rounds")
    print(f"the swap's backend, no backend named: {sw.get('backend')} ({sw.get('backend_why')})")
    print(f"{'case':<30}{'samples/s':>11}{'vs readers.file':>17}{'CPU us/sample (pipeline+daemon)':>33}")
    for dec in ("", " + decode"):
        base = med([r["samples_per_s"] for r in by["readers.file" + dec]])
        for case in ("readers.file", "swap", "swap, backend file"):
            xs = by[case + dec]
            v = med([r["samples_per_s"] for r in xs])
            c = med([(r["client_cpu_s"] + r["daemon_cpu_s"]) / r["samples"] * 1e6 for r in xs])
            print(f"{case + dec:<30}{v:>11.0f}{v / base:>16.2f}x{c:>33.0f}")
    cpu = by["cpu per sample"]
    cd, cc = med([r["daemon_us"] for r in cpu]), med([r["client_us"] for r in cpu])
    print(f"loader CPU per sample (LoaderSource alone, backend {cpu[0]['backend']}, batch 64, 3 epochs, cold): "
          f"daemon {cd:.1f} + client {cc:.1f} = {cd + cc:.1f} us")
    for b in ("gds", "file"):
        o = by[f"open {b}"][0]
        print(f"session open, {b}, npy dataset: first {o['first_s'] * 1e3:.1f} ms, then median {o['median_s'] * 1e3:.1f} ms")
    goal = 1.5 if dev == "ram" else 1.0
    sps = lambda label: by_round(by[label], "samples_per_s")
    o = by["open gds"][0]
    print(goal_line(f"{dev}: swap vs readers.file, reader only", ratio(sps("swap"), sps("readers.file")), "x", ">=", goal))
    print(goal_line(f"{dev}: swap vs readers.file, with decode", ratio(sps("swap + decode"), sps("readers.file + decode")),
                    "x", ">=", goal))
    print(goal_line(f"{dev}: CPU per sample, daemon + client", figure(r["daemon_us"] + r["client_us"] for r in cpu),
                    " us", "<=", 5, 1))
    print(f"goal: {dev}: session open, gds, npy: {max(o['first_s'], o['median_s']) * 1e3:.1f} ms (< 50)")
PY
