#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What the default lifetime of a batch read by user code costs: a plain
# Python loop over LoaderSource, copies (the default outside DALI) against
# views (zero_copy=True), on one daemon serving an ImageNet-shaped image
# dataset (FILES files of ~110 KB, batch 64) and a tensor dataset (NPY
# float32 256x256 arrays, 256 KiB each, batch 16), warm page cache, a
# RAM-backed ext4 loop device, backend gds (file without raw reads).
# ROUNDS rounds of 3 epochs per case, alternating (bench/lifetime_cost.py):
# medians of samples/s and the client's CPU per batch.
#
# Needs root. Usage: bench/lifetime_cost.sh [ROUNDS] (env: FILES, default
# 3000; NPY, default 1000)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's client, not the venv's
rounds=${1:-5}
export FILES=${FILES:-3000}
. bench/lib.sh
d=
cleanup() { [[ -n $d ]] && { kill -TERM "$d"; wait "$d" || true; }; bench_cleanup; }
trap cleanup EXIT
[[ -x bin/gendataset ]] || go build -o bin/ ./tools/gendataset
bench_device ram "$PWD/.bench/lifetime" 2G
w=$bench_work
bin/gendataset --out "$w/mnt/train" --files "$FILES" --classes 100 --mean 110000 >/dev/null
.venv/bin/python bench/npy_dataset.py --out "$w/mnt/volumes" --files "${NPY:-1000}" --shape 256,256 >/dev/null
sync
bin/mkbmap --mountpoint "$w/mnt/train" -o "$w/train.bmap" 2>/dev/null
bin/mkbmap --reader numpy --mountpoint "$w/mnt/volumes" -o "$w/volumes.bmap" 2>/dev/null
rm -f "$w/d.sock"
bin/loaderd serve --socket "$w/d.sock" --dataset "train=$w/train.bmap" --dataset "volumes=$w/volumes.bmap" \
  2>"$w/loaderd.log" & d=$!
while [[ ! -S $w/d.sock ]]; do sleep 0.02; done
.venv/bin/python bench/lifetime_cost.py --socket "$w/d.sock" --dataset train:64 --dataset volumes:16 --rounds "$rounds"
