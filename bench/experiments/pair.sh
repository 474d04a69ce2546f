#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gds against fio's best single setting on the same bytes, paired: each
# round runs `loaderd bench --backend gds` and fio replaying every raw
# sample's extents in shuffled order at queue depth QD back to back, cold,
# the order alternating; prints each pair's ratio and the median. On a
# noisy device a paired ratio says more than two separate medians.
#
# Needs root. Usage: bench/experiments/pair.sh DEVICE ROUNDS [QD] [gds flags...]
#   DEVICE: virtio or ram; QD: fio's queue depth (default 16);
#   env FILES (default 12000)
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $# -ge 2 ]] || { sed -n '3,11p' "$0" >&2; exit 2; }
device=$1 rounds=$2 qd=${3:-16}; shift $(( $# >= 3 ? 3 : 2 ))
. bench/lib.sh
trap bench_cleanup EXIT
bench_dataset "$device" "$PWD/.bench/pair"
w=$bench_work
bin/mkbmap inspect --format json -o "$w/train.json" "$w/train.bmap" >/dev/null
.venv/bin/python bench/iolog_shuffled.py --map-json "$w/train.json" --out "$w/shuffled.iolog" --seed 1 >/dev/null
sps() { python3 -c 'import json,sys; print(json.load(sys.stdin)["samples_per_s"])'; }
gds() { drop; bin/loaderd bench --bmap "$w/train.bmap" --backend gds --shuffle --seed 1 --json "$@" 2>/dev/null | sps; }
fio() { drop; .venv/bin/python bench/fio_replay.py --iolog "$w/shuffled.iolog" --samples "${FILES:-12000}" --iodepth "$qd" | sps; }
ratios=()
for r in $(seq "$rounds"); do
  if (( r % 2 )); then g=$(gds "$@"); f=$(fio); else f=$(fio); g=$(gds "$@"); fi
  ratio=$(python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}')" "$g" "$f")
  printf 'gds %.0f  fio qd%s %.0f  ratio %s\n' "$g" "$qd" "$f" "$ratio"
  ratios+=("$ratio")
done
python3 -c "import statistics, sys; print(f'median ratio {statistics.median(map(float, sys.argv[1:])):.2f} over {len(sys.argv) - 1} rounds')" "${ratios[@]}"
