#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What the DALI swap's epochs cost when they run into each other: the
# README's swap (bench/swap.py, one DALI CPU pipeline, no decode) with and
# without pad_last_batch, fn.readers.file and nvfeed.dali.reader, warm
# page cache, a RAM-backed ext4 loop device, FILES files of ~110 KB
# (default 3000), batch 64. Without padding DALI's readers fill an
# epoch's last batch from the next epoch, and the swap copies each sample
# once to build such batches; with padding it hands DALI the daemon's
# batches as they are. ROUNDS rounds (default 5), the four cases
# alternating; one JSON line a run, then the medians.
#
# Needs root and DALI. Usage: bench/dali_pad_cost.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's client, not the venv's
rounds=${1:-5}
. bench/lib.sh
d=
cleanup() { [[ -n $d ]] && { kill -TERM "$d"; wait "$d" || true; }; bench_cleanup; }
trap cleanup EXIT
[[ -x bin/gendataset ]] || go build -o bin/ ./tools/gendataset
FILES=${FILES:-3000} bench_dataset ram "$PWD/.bench/dalipad"
w=$bench_work
rm -f "$w/d.sock"
bin/loaderd serve --socket "$w/d.sock" --dataset "train=$w/train.bmap" 2>"$w/loaderd.log" & d=$!
while [[ ! -S $w/d.sock ]]; do sleep 0.02; done
cat "$w/mnt/train"/*/* >/dev/null  # warm: both read from the page cache
out=$w/runs.jsonl
: >"$out"
for _ in $(seq "$rounds"); do
  for c in "readers.file" "readers.file --no-pad" "swap" "swap --no-pad"; do
    # shellcheck disable=SC2086
    .venv/bin/python bench/swap.py $c --datadir "$w/mnt/train" --socket "$w/d.sock" | tee -a "$out"
  done
done
.venv/bin/python - "$out" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print("| reader | pad_last_batch | samples/s (median, min-max) | client CPU s |")
print("|---|---|---|---|")
for case in ("readers.file", "swap"):
    for pad in (True, False):
        rs = [r for r in runs if r["case"] == case and r["pad"] == pad]
        sps = [r["samples_per_s"] for r in rs]
        print(f"| {case} | {pad} | {statistics.median(sps):.0f} ({min(sps):.0f}-{max(sps):.0f}) | "
              f"{statistics.median(r['client_cpu_s'] for r in rs):.2f} |")
PY
