#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End to end, as a user runs it: CPU DALI pipelines that read (no decode),
# num_threads=2, one epoch each, side by side in one run, at batch 16, 64
# and 256: the ceiling (fn.external_source over the same files already in
# memory: no loader can beat it; and the same with its reading of the files
# counted, cold: the ceiling cold), fn.readers.file, and
# fn.external_source(LoaderSource) for every backend. The ceiling is fed
# as LoaderSource feeds DALI (one TensorListCPU of views per batch); the
# same fed lists of numpy views is shown beside it. Loader and reader
# cases are cold (sync; drop_caches before each); the case order is
# reversed every other round. The summary gives medians and each case's
# ratio to readers.file and to the ceiling.
#
# CONSUME=output (default) returns the bytes from the pipeline, which DALI
# makes contiguous with a copy of every byte; CONSUME=operator hands them
# to an operator instead (their shape, standing in for a decoder: no copy).
#
# Needs root. Usage: bench/e2e.sh DEVICE [ROUNDS]   (DEVICE virtio or ram;
# env: FILES, default 12000; BATCHES, default "16 64 256"; CONSUME;
# LOADERD, the daemon to run, default bin/loaderd: another build for an A/B)
set -euo pipefail
cd "$(dirname "$0")/.."
device=${1:?usage: bench/e2e.sh virtio|ram [ROUNDS]} rounds=${2:-3}
. bench/lib.sh
trap bench_cleanup EXIT
bench_dataset "$device" "$PWD/.bench/e2e"
w=$bench_work root=$w/mnt/train out=$w/e2e.jsonl
: > "$out"
bench_serve "$w/d.sock" "$w/loaderd.log" --dataset "train=$w/train.bmap"
consume=${CONSUME:-output} batches=${BATCHES:-16 64 256}
bm() { .venv/bin/python python/examples/benchmark.py --threads 2 --consume "$consume" --json --batchsize "$@"; }
cases=()
for bs in $batches; do
  cases+=("ceiling|$bs|warm|dali-memory --datadir $root" "ceiling, numpy lists|$bs|warm|dali-memory --datadir $root --batch-format numpy"
          "ceiling, cold|$bs|cold|dali-memory --datadir $root --load-in-clock"
          "readers.file|$bs|cold|dali --datadir $root")
  for b in file gds bam; do cases+=("LoaderSource $b|$bs|cold|loader-dali --socket $w/d.sock --dataset train --backend $b"); done
done
for r in $(seq 1 "$rounds"); do
  order=("${cases[@]}")
  if (( r % 2 == 0 )); then order=(); for ((i = ${#cases[@]} - 1; i >= 0; i--)); do order+=("${cases[i]}"); done; fi
  for c in "${order[@]}"; do
    IFS='|' read -r label bs temp args <<<"$c"
    [[ $temp == cold ]] && drop
    # shellcheck disable=SC2086 # args are the source's flags
    bm "$bs" $args | .venv/bin/python -c 'import json,sys; r=json.load(sys.stdin); r.update(case=sys.argv[1], batch=int(sys.argv[2]), round=int(sys.argv[3])); print(json.dumps(r))' "$label" "$bs" "$r" >> "$out"
  done
  echo "e2e: $device: round $r of $rounds done" >&2
done
.venv/bin/python - "$out" "$device" "$consume" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
nb = len({r["batch"] for r in rows})
ncases = len({r["case"] for r in rows})
print(f"\n{sys.argv[2]} device, DALI CPU pipelines (num_threads=2, read only, bytes to {sys.argv[3]}), one epoch, medians of {len(rows) // (ncases * nb)} rounds")
print(f"{'case':<22}{'batch':>6}{'samples/s':>11}{'vs readers.file':>17}{'vs ceiling':>12}")
for bs in sorted({r["batch"] for r in rows}):
    med = {}
    for r in rows:
        if r["batch"] == bs:
            med.setdefault(r["case"], []).append(r["samples_per_s"])
    med = {k: statistics.median(v) for k, v in med.items()}
    for case, v in med.items():
        print(f"{case:<22}{bs:>6}{v:>11.0f}{v / med['readers.file']:>16.2f}x{v / med['ceiling']:>11.2f}x")
sys.path.insert(0, "bench")
from rounds import by_round, ratio, verdict
print("round by round, the median ratio and its spread (the goal: LoaderSource gds >= 0.9x the ceiling,"
      " the loader cold against the ceiling warm; and both cold):")
for bs in sorted({r["batch"] for r in rows}):
    of = lambda case: by_round([r for r in rows if r["batch"] == bs and r["case"] == case], "samples_per_s")
    for case in ("LoaderSource gds", "LoaderSource file"):
        for ref in ("ceiling", "ceiling, cold", "readers.file"):
            f = ratio(of(case), of(ref))
            says = verdict(f, ">=", 0.9) if case == "LoaderSource gds" and ref.startswith("ceiling") else ""
            print(f"{case} vs {ref}, batch {bs}: {f.text()}x over {f.rounds} rounds {says}".rstrip())
PY
