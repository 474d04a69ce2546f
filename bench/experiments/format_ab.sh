#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What LoaderSource hands DALI, A/B: a list of numpy views per batch
# (batch_format="numpy") against one TensorListCPU of views
# (batch_format="dali"), cold, alternating (the order swapped every other
# round), DALI CPU pipelines with num_threads=2; medians and their ratio.
# SOURCE loader-dali reads through LoaderSource gds; dali-memory is the
# in-memory ceiling fed either way.
#
# Needs root. Usage: bench/experiments/format_ab.sh [BATCH] [ROUNDS] [SOURCE]
# (env: CONSUME, default operator; FILES, default 12000)
set -euo pipefail
cd "$(dirname "$0")/../.."
bs=${1:-64} rounds=${2:-7} src=${3:-loader-dali} consume=${CONSUME:-operator}
. bench/lib.sh
d=
cleanup() { [[ -n $d ]] && { kill -TERM "$d"; wait "$d" || true; }; bench_cleanup; }
trap cleanup EXIT
bench_dataset ram "$PWD/.bench/format"
w=$bench_work
rm -f "$w/d.sock"
bin/loaderd serve --socket "$w/d.sock" --dataset "train=$w/train.bmap" 2>"$w/loaderd.log" & d=$!
while [[ ! -S $w/d.sock ]]; do sleep 0.02; done
for r in $(seq "$rounds"); do
  fs="numpy dali"; (( r % 2 == 0 )) && fs="dali numpy"
  for f in $fs; do
    drop
    if [[ $src == loader-dali ]]; then args=(loader-dali --socket "$w/d.sock" --dataset train --backend gds)
    else args=(dali-memory --datadir "$w/mnt/train"); fi
    echo "$f $(.venv/bin/python python/examples/benchmark.py --threads 2 --consume "$consume" --json --batchsize "$bs" \
      "${args[@]}" --batch-format "$f" | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["samples_per_s"])')"
  done
done | .venv/bin/python -c '
import statistics, sys
runs = {}
for line in sys.stdin:
    f, v = line.split()
    runs.setdefault(f, []).append(float(v))
for f, v in runs.items():
    print(f"{f:6} median {statistics.median(v):8.0f} samples/s  runs " + " ".join(f"{x:.0f}" for x in v))
med = {f: statistics.median(v) for f, v in runs.items()}
ratio = med["dali"] / med["numpy"]
print(f"dali/numpy {ratio:.2f}x")
' 
