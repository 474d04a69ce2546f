#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The demo: generate an ImageNet-shaped dataset on a loop-mounted ext4 image
# (attached with --direct-io=on), map it with mkbmap --verify and print the
# summary. Without root (no loop devices) it uses a directory under .demo/
# instead, which works when that directory is on ext4 or xfs.
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${DEMO_FILES:-2000}
work=$PWD/.demo
mkdir -p "$work"
cleanup() {
  if [[ -n ${daemon:-} ]]; then kill -TERM "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true; fi
  if [[ -n ${mnt:-} ]] && mountpoint -q "$mnt"; then umount "$mnt"; fi
  if [[ -n ${loop:-} ]]; then losetup -d "$loop" 2>/dev/null || true; fi
  rm -f "$work/demo.img"
}
trap cleanup EXIT

if [[ $(id -u) == 0 ]] && losetup -f >/dev/null 2>&1; then
  truncate -s 2G "$work/demo.img"
  mkfs.ext4 -q -F -b 4096 -O inline_data "$work/demo.img"
  loop=$(losetup --find --show --direct-io=on "$work/demo.img")
  mnt=$work/mnt
  mkdir -p "$mnt" && mount "$loop" "$mnt"
  root=$mnt/train
  echo "demo: ext4 image on $loop mounted at $mnt"
else
  root=$work/data/train
  rm -rf "$root"
  echo "demo: not root or no loop device: using $root on $(stat -f -c %T "$work")"
fi

bin/gendataset --out "$root" --files "$FILES" --classes 20
sync
bin/mkbmap --mountpoint "$root" -o "$work/train.bmap" --verify
bin/mkbmap inspect "$work/train.bmap"
echo
echo "demo: loaderd bench (file backend, shuffled, every sample verified against its file)"
bin/loaderd bench --bmap "$work/train.bmap" --batch-size 64 --shuffle --verify
echo
echo "demo: loaderd bench, O_DIRECT, cold page cache"
[[ $(id -u) == 0 ]] && { sync; echo 3 > /proc/sys/vm/drop_caches; }
bin/loaderd bench --bmap "$work/train.bmap" --batch-size 64 --shuffle --direct
if [[ $(id -u) == 0 ]]; then
  for backend in gds bam; do
    echo
    echo "demo: loaderd bench --backend $backend (raw extents from ${loop:-the device}, O_DIRECT, cold), verified"
    sync; echo 3 > /proc/sys/vm/drop_caches
    bin/loaderd bench --bmap "$work/train.bmap" --batch-size 64 --shuffle --backend "$backend" --verify
  done
fi

echo
echo "demo: loaderd serve on the demo dataset; the Python client (nvfeed.LoaderSource) reads it"
sock=$work/loaderd.sock
bin/loaderd serve --socket "$sock" --dataset "train=$work/train.bmap" 2>"$work/loaderd.log" &
daemon=$!
for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.05; done
[[ -S $sock ]] || { cat "$work/loaderd.log"; exit 1; }
backends=(file)
[[ $(id -u) == 0 ]] && backends+=(gds bam)
for backend in "${backends[@]}"; do
  .venv/bin/python python/examples/benchmark.py --batchsize 64 loader --socket "$sock" --dataset train --backend "$backend"
done

# The closing table: every row cold (page cache dropped before each) on the
# same dataset, so the ratios say what a training job reading it from disk
# would see. Without root (no drop_caches, no raw device) it is skipped.
if [[ $(id -u) == 0 ]]; then
  echo
  echo "demo: cold reads of the same $FILES files, side by side (each row after dropping the page cache)"
  bin/mkbmap inspect --format json -o "$work/train.json" "$work/train.bmap" >/dev/null
  .venv/bin/python bench/iolog_shuffled.py --map-json "$work/train.json" --out "$work/shuffled.iolog" --seed 1 >/dev/null
  results=$work/demo.jsonl
  : > "$results"
  row() { local name=$1; shift; sync; echo 3 > /proc/sys/vm/drop_caches
    "$@" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); r["case"]=sys.argv[1]; r["round"]=1; print(json.dumps(r))' "$name" >> "$results"; }
  bench() { .venv/bin/python python/examples/benchmark.py --batchsize 64 --json "$@"; }
  row "python-file cold" bench python-file --datadir "$root"
  if .venv/bin/python -c 'import nvidia.dali' 2>/dev/null; then
    row "dali readers.file cold" bench dali --datadir "$root"
    row "dali external_source gds cold" bench loader-dali --socket "$sock" --dataset train --backend gds
  fi
  row "LoaderSource gds cold" bench loader --socket "$sock" --dataset train --backend gds
  row "loaderd bench gds cold" bin/loaderd bench --bmap "$work/train.bmap" --batch-size 64 --shuffle --backend gds --json
  row "loaderd bench file cold" bin/loaderd bench --bmap "$work/train.bmap" --batch-size 64 --shuffle --json
  for qd in 16 32 64; do
    row "fio shuffled qd$qd cold" .venv/bin/python bench/fio_replay.py --iolog "$work/shuffled.iolog" --samples "$FILES" --iodepth $qd
  done
  .venv/bin/python bench/compare.py --brief < "$results"
fi
