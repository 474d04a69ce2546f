#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# N concurrent sessions (bench/sessions.py) on a daemon with raw engines per
# device (shared by the sessions) against one with engines per session,
# side by side in one run: every round runs both cold, the order reversed
# every other round; medians at the end, with fio's best on the same bytes
# (shuffled order, qd 16/32/64) as the device limit.
#
# Needs root. Usage: bench/experiments/engines.sh DEVICE ROUNDS [SESSIONS] [BACKEND]
#   DEVICE: virtio or ram; env FILES (default 12000)
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $# -ge 2 ]] || { sed -n '3,10p' "$0" >&2; exit 2; }
device=$1 rounds=$2 sessions=${3:-8} be=${4:-gds}
FILES=${FILES:-12000}
. bench/lib.sh
daemon=
stop() { if [[ -n $daemon ]]; then kill -TERM "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true; fi; daemon=; }
trap 'stop; bench_cleanup' EXIT
bench_dataset "$device" "$PWD/.bench/engines"
work=$bench_work
bin/mkbmap inspect --format json -o "$work/train.json" "$work/train.bmap" >/dev/null
.venv/bin/python bench/iolog_shuffled.py --map-json "$work/train.json" --out "$work/shuffled.iolog" --seed 1 >/dev/null
out=$work/results.jsonl
: > "$out"
tag() { python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); r["case"]=sys.argv[1]; print(json.dumps(r))' "$1"; }
for r in $(seq 1 "$rounds"); do
  order="device session"; (( r % 2 == 0 )) && order="session device"
  for scope in $order; do
    rm -f "$work/loaderd.sock"
    bin/loaderd serve --engines "$scope" --socket "$work/loaderd.sock" --dataset "train=$work/train.bmap" 2>"$work/loaderd-$scope.log" &
    daemon=$!
    for _ in $(seq 500); do [[ -S $work/loaderd.sock ]] && break; sleep 0.02; done
    drop
    .venv/bin/python bench/sessions.py --socket "$work/loaderd.sock" --sessions "$sessions" --backend "$be" | tag "engines per $scope" >> "$out"
    stop
  done
  for qd in 16 32 64; do
    drop
    .venv/bin/python bench/fio_replay.py --iolog "$work/shuffled.iolog" --samples "$FILES" --iodepth "$qd" | tag "fio qd$qd" >> "$out"
  done
done
python3 - "$out" "$device" "$sessions" "$be" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = lambda c: statistics.median(r["samples_per_s"] for r in rows if r["case"] == c)
fio = max(med(f"fio qd{q}") for q in (16, 32, 64))
print(f"device {sys.argv[2]}, {sys.argv[3]} sessions {sys.argv[4]}, cold, medians; fio best {fio:.0f} samples/s")
for c in ("engines per device", "engines per session"):
    each = " ".join(f"{r['samples_per_s']:.0f}" for r in rows if r["case"] == c)
    op = statistics.median(r["open_s_median"] for r in rows if r["case"] == c)
    print(f"{c:<22}{med(c):>9.0f} samples/s {med(c) / fio:5.2f}x fio best  open {op:.2f} s   {each}")
PY
