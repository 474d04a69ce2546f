#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# WebDataset tar shards: shuffle quality and cold throughput, batch 64.
#
# bash bench/wds.sh [ROUNDS]   (root; bin/ and .venv built; ~10 minutes with ROUNDS=1)
#
# Shuffle quality (bench/wds_shuffle.py) on class-sorted shards (100
# classes stored class after class, QSAMPLES samples of 16 bytes, RAM
# device): fn.readers.webdataset at its default and a large initial_fill,
# webdataset with shardshuffle and a buffer, loaderd's permutation and
# its shuffle="dali", against a uniform permutation.
# Throughput (bench/wds_read.py), cold, on the virtio disk and the
# RAM-backed device (bench/lib.sh): class-sorted shards of ~110 KB .jpg
# (SAMPLES samples), loaderd's global permutation (gds: LoaderSource, and
# nvfeed.dali.reader in a DALI pipeline) against fn.readers.webdataset
# sequential and webdataset + DataLoader(num_workers=2) shuffled.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-1}
SAMPLES=${SAMPLES:-6000}
QSAMPLES=${QSAMPLES:-30000}
DEVICES=${DEVICES:-virtio ram}
# shellcheck source=bench/lib.sh
source bench/lib.sh
work=$PWD/.bench-wds
mkdir -p "$work"
rates=$work/rates.jsonl
: > "$rates"
daemon=
cleanup() {
  if [[ -n $daemon ]]; then kill -TERM "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true; fi
  daemon=
  bench_cleanup
}
trap cleanup EXIT
py=.venv/bin/python
serve() { # NAME=MAP...
  bin/loaderd serve --socket "$work/loaderd.sock" "${@/#/--dataset=}" 2>"$work/loaderd.log" &
  daemon=$!
  for _ in $(seq 500); do [[ -S $work/loaderd.sock ]] && break; sleep 0.02; done
}
for device in $DEVICES; do
  bench_device "$device" "$work" 2G
  root=$work/mnt/wds
  $py bench/wds_dataset.py --out "$root" --classes 100 --per-class $((SAMPLES / 100)) --per-shard 500 --mean 110000 >/dev/null
  sync
  bin/mkbmap --reader webdataset --mountpoint "$root" -o "$work/wds.bmap" 2>/dev/null
  maps=("wds=$work/wds.bmap")
  if [[ $device == ram ]]; then
    $py bench/wds_dataset.py --out "$work/mnt/q" --classes 100 --per-class $((QSAMPLES / 100)) --per-shard 1000 >/dev/null
    sync
    bin/mkbmap --reader webdataset --mountpoint "$work/mnt/q" -o "$work/q.bmap" 2>/dev/null
    maps+=("q=$work/q.bmap")
  fi
  serve "${maps[@]}"
  rd() { $py bench/wds_read.py "$1" --root "$root" --socket "$work/loaderd.sock" --samples "$SAMPLES" --case "$device ${2:-$1}" 2>/dev/null | tee -a "$rates"; }
  for _ in $(seq "$ROUNDS"); do
    rd nvfeed "nvfeed permute gds (LoaderSource)"
    rd nvfeed-dali "nvfeed permute gds (nvfeed.dali.reader)"
    rd dali "fn.readers.webdataset sequential"
    rd webdataset "webdataset shuffled + DataLoader(num_workers=2)"
  done
  if [[ $device == ram ]]; then
    $py bench/wds_shuffle.py --root "$work/mnt/q" --socket "$work/loaderd.sock" --dataset q 2>/dev/null
  fi
  cleanup
done
echo "wds throughput: one cold epoch, batch 64, $SAMPLES samples"
$py bench/wds_read.py --table < "$rates"
