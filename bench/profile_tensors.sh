#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Where the machine's CPU goes while loaderd bench --backend gds reads
# 16 MiB tensors into pinned memory from the RAM-backed device, beside
# fio's best setting on the same bytes (bench/tensors.sh's cases): perf
# record -a -g of EPOCHS epochs of each (O_DIRECT reads of the device: no
# page cache, so every epoch reads the device; loaderd's set-up, a small
# share, is in the profile), ROUNDS times, alternating; then each
# profile's share of CPU time by thread group and loaderd's samples by
# what their stacks do (bench/perf_shares.py), and the Go CPU profile of
# the last loaderd run (go tool pprof -top), with each run's figures.
#
# Needs root, perf and fio. Usage: bench/profile_tensors.sh [ROUNDS]
# (env: SIZE 16m or 256k, default 16m; TOTAL_MB, default 4096; EPOCHS,
# default 4; FIO, fio's setting REQ:QD[:fixedbufs], default 1m:4;
# GDS_FLAGS, more loaderd bench flags; OUT, default /tmp)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3} size=${SIZE:-16m} total=${TOTAL_MB:-4096} epochs=${EPOCHS:-4} fioset=${FIO:-1m:4} out=${OUT:-/tmp}
PY=.venv/bin/python
. bench/lib.sh
trap bench_cleanup EXIT
bench_tensor_set ram "$PWD/.bench/prof-tensors" "$size" "$total"
w=$bench_work
IFS=: read -r req qd fb <<<"$fioset"
"$PY" bench/iolog_shuffled.py --map-json "$w/t.json" --out "$w/fio.iolog" --seed 1 --epochs "$epochs" \
  --request "$(numfmt --from=iec "${req^^}")" >/dev/null
fioflags=(--name=replay "--read_iolog=$w/fio.iolog" --replay_no_stall=1 --direct=1 --ioengine=io_uring "--iodepth=$qd"
          --output-format=json)
[[ -n $fb ]] && fioflags+=(--fixedbufs)
rate() { "$PY" -c 'import json, sys; t = sys.stdin.read(); r = json.loads(t[t.index("{"):]); j = r.get("jobs", [r])[0]
b = j["read"]["io_bytes"] if "read" in j else j["bytes"]; s = j["job_runtime"] / 1000 if "read" in j else j["seconds"]
print(f"{sys.argv[1]}: {b / s / 1e9:.2f} GB/s")' "$1"; }
for i in $(seq "$rounds"); do
  drop
  # shellcheck disable=SC2086 # GDS_FLAGS: more flags, as words
  perf record -a -g -F 999 -o "$out/perf-tensors-gds$i.data" -- \
    bin/loaderd bench --bmap "$w/t.bmap" --batch-size "$batch" --shuffle --epochs "$epochs" --backend gds --json \
    --cpuprofile "$out/loaderd-tensors-gds.pprof" ${GDS_FLAGS:-} 2>/dev/null | rate "gds round $i"
  drop
  perf record -a -g -F 999 -o "$out/perf-tensors-fio$i.data" -- fio "${fioflags[@]}" 2>/dev/null | rate "fio $fioset round $i"
done
"$PY" bench/perf_shares.py "$out"/perf-tensors-gds*.data "$out"/perf-tensors-fio*.data
echo
echo "loaderd's Go CPU profile (the last gds run): go tool pprof -top"
PATH=$PWD/.tools/go/bin:$PATH go tool pprof -top -nodecount 30 bin/loaderd "$out/loaderd-tensors-gds.pprof" 2>/dev/null | sed -n '1,40p'
