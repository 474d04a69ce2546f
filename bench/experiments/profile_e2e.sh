#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Where the whole machine's CPU goes while a DALI pipeline reads one epoch
# through LoaderSource gds (num_threads=2), and in the in-memory ceiling:
# perf record -a -g, switched on and off around the timed epoch only
# (benchmark.py writes enable/disable to perf's control FIFO). ROUNDS
# LoaderSource runs and ROUNDS ceiling runs, cold, alternating; then each
# profile's share of CPU time by thread group (bench/perf_shares.py).
#
# Needs root and perf. Usage: bench/experiments/profile_e2e.sh [ROUNDS]
# (env: CONSUME, default operator; BATCH, default 64; OUT, default /tmp)
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3} consume=${CONSUME:-operator} bs=${BATCH:-64} out=${OUT:-/tmp}
. bench/lib.sh
d=
cleanup() { [[ -n $d ]] && { kill -TERM "$d"; wait "$d" || true; }; bench_cleanup; }
trap cleanup EXIT
bench_dataset ram "$PWD/.bench/prof"
w=$bench_work
rm -f "$w/d.sock" "$w/perfctl"; mkfifo "$w/perfctl"
bin/loaderd serve --socket "$w/d.sock" --dataset "train=$w/train.bmap" 2>"$w/loaderd.log" & d=$!
while [[ ! -S $w/d.sock ]]; do sleep 0.02; done
rec() {
  local name=$1; shift
  drop
  PERF_CTL_FIFO=$w/perfctl perf record -a -g -F 999 --delay=-1 --control "fifo:$w/perfctl" -o "$out/$name.data" -- \
    .venv/bin/python python/examples/benchmark.py --threads 2 --consume "$consume" --batchsize "$bs" "$@" 2>/dev/null
}
for i in $(seq "$rounds"); do
  rec "perf-gds$i" loader-dali --socket "$w/d.sock" --dataset train --backend gds
  rec "perf-ceiling$i" dali-memory --datadir "$w/mnt/train"
done
.venv/bin/python bench/perf_shares.py "$out"/perf-gds*.data "$out"/perf-ceiling*.data
