#!/usr/bin/env bash
# Where the whole machine's CPU goes while a DALI pipeline reads one epoch
# through LoaderSource gds (batch 64, num_threads=2), and in the in-memory
# ceiling: perf record -a -g, switched on and off around the timed epoch
# only (benchmark.py writes enable/disable to perf's control FIFO). Three
# LoaderSource runs, one ceiling run, cold; then
#   perf report -i /tmp/perfN.data --no-children --sort comm -g none
# Needs root and perf. Usage: bench/profile_e2e.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
d=
cleanup() { [[ -n $d ]] && { kill -TERM "$d"; wait "$d" || true; }; bench_cleanup; }
trap cleanup EXIT
bench_dataset ram "$PWD/.bench/prof"
w=$bench_work
rm -f $w/d.sock /tmp/perfctl; mkfifo /tmp/perfctl
bin/loaderd serve --socket "$w/d.sock" --dataset "train=$w/train.bmap" 2>"$w/loaderd.log" & d=$!
while [[ ! -S $w/d.sock ]]; do sleep 0.02; done
for i in 1 2 3; do
drop
PERF_CTL_FIFO=/tmp/perfctl perf record -a -g -F 999 --delay=-1 --control fifo:/tmp/perfctl -o /tmp/perf$i.data -- .venv/bin/python python/examples/benchmark.py --threads 2 --batchsize 64 loader-dali --socket $w/d.sock --dataset train --backend gds 2>/dev/null
done
drop
PERF_CTL_FIFO=/tmp/perfctl perf record -a -g -F 999 --delay=-1 --control fifo:/tmp/perfctl -o /tmp/perfceil.data -- .venv/bin/python python/examples/benchmark.py --threads 2 --batchsize 64 dali-memory --datadir $w/mnt/train 2>/dev/null
