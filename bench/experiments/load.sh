#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# N sessions (bench/sessions.py) on one daemon, RUNS times, on a fresh
# dataset: per run the steady-state aggregate, the sessions' open times, the
# daemon's peak resident memory (VmRSS, sampled every 50 ms) and how busy
# the machine was (/proc/stat) with the daemon's share of it.
#
# Needs root. Usage: bench/experiments/load.sh DEVICE RUNS [SESSIONS] [LOADERD] [EPOCHS]
#   DEVICE: virtio or ram; LOADERD: the binary (default bin/loaderd);
#   env FILES (default 12000)
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $# -ge 2 ]] || { sed -n '3,11p' "$0" >&2; exit 2; }
device=$1 runs=$2 sessions=${3:-8} loaderd=${4:-bin/loaderd} epochs=${5:-3}
. bench/lib.sh
d=
trap '[[ -n $d ]] && { kill -TERM "$d"; wait "$d" 2>/dev/null || true; }; bench_cleanup' EXIT
bench_dataset "$device" "$PWD/.bench/load"
w=$bench_work
rm -f "$w/s.sock"
"$loaderd" serve --socket "$w/s.sock" --dataset "train=$w/train.bmap" 2>"$w/d.log" & d=$!
for _ in $(seq 500); do [[ -S $w/s.sock ]] && break; sleep 0.02; done
for _ in $(seq "$runs"); do
  s0=$(head -1 /proc/stat) c0=$(awk '{print $14+$15}' "/proc/$d/stat")
  .venv/bin/python bench/sessions.py --socket "$w/s.sock" --sessions "$sessions" --epochs "$epochs" > "$w/out.json" &
  p=$! peak=0
  while kill -0 "$p" 2>/dev/null; do
    r=$(awk '/VmRSS/{print $2}' "/proc/$d/status"); (( r > peak )) && peak=$r; sleep 0.05
  done
  wait "$p"
  s1=$(head -1 /proc/stat) c1=$(awk '{print $14+$15}' "/proc/$d/stat")
  python3 - "$w/out.json" "$s0" "$s1" "$c0" "$c1" "$peak" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
a, b = (list(map(int, x.split()[1:])) for x in sys.argv[2:4])
total, idle = sum(b) - sum(a), (b[3] + b[4]) - (a[3] + a[4])
daemon = (int(sys.argv[5]) - int(sys.argv[4])) / total
print(f"{r['samples_per_s']:.0f} samples/s; opens median {r['open_s_median']:.2f} s, max {r['open_s_max']:.2f} s; "
      f"daemon peak RSS {int(sys.argv[6]) // 1024} MiB; machine busy {(total - idle) / total:.0%}, daemon {daemon:.0%} of all CPU time")
PY
done
