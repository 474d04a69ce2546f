#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Python client against loaderd bench, warm page cache, on a RAM-backed
# ext4 loop device: RUNS alternating runs of `loaderd bench` and of
# LoaderSource through a daemon (python/examples/benchmark.py), same
# batch size; prints each pair and its ratio. Needs root.
# Usage: bench/experiments/client_ratio.sh [BATCH] [RUNS]   (env: FILES, default 4000)
set -euo pipefail
cd "$(dirname "$0")/../.."
BATCH=${1:-16} RUNS=${2:-5} FILES=${FILES:-4000}
w=$PWD/.bench/client; mkdir -p "$w"; img=/dev/shm/nvfeed-client.img
truncate -s 2G "$img"; mkfs.ext4 -q -F -b 4096 "$img"
loop=$(losetup --find --show --direct-io=on "$img"); mkdir -p "$w/mnt"; mount "$loop" "$w/mnt"
d=
cleanup() { [[ -n $d ]] && { kill -TERM "$d"; wait "$d" || true; }; umount "$w/mnt" 2>/dev/null || umount -l "$w/mnt"; losetup -d "$loop"; rm -f "$img"; }
trap cleanup EXIT
bin/gendataset --out "$w/mnt/train" --files "$FILES" --classes 40 --mean 110000 >/dev/null; sync
bin/mkbmap --mountpoint "$w/mnt/train" -o "$w/train.bmap" 2>/dev/null
bin/loaderd serve --socket "$w/d.sock" --dataset "train=$w/train.bmap" 2>"$w/d.log" & d=$!
while [[ ! -S $w/d.sock ]]; do sleep 0.02; done
sps() { python3 -c 'import json,sys; print(json.load(sys.stdin)["samples_per_s"])'; }
client() { .venv/bin/python python/examples/benchmark.py --batchsize "$BATCH" --batches $((3 * FILES / BATCH)) --json loader --socket "$w/d.sock" --dataset train --backend file; }
client >/dev/null # warm the page cache
for _ in $(seq "$RUNS"); do
  a=$(bin/loaderd bench --bmap "$w/train.bmap" --batch-size "$BATCH" --shuffle --epochs 3 --json 2>/dev/null | sps)
  b=$(client | sps)
  python3 -c "import sys; a, b = map(float, sys.argv[1:]); print(f'loaderd bench {a:.0f}  client {b:.0f}  ratio {b / a:.2f}')" "$a" "$b"
done
