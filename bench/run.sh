#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Side-by-side read benchmark on one ImageNet-shaped dataset (~12 000 files,
# lognormal around 110 KB), on two devices: a loop device over a file on the
# VM's virtio disk, and a RAM-backed one (an image in /dev/shm; a stand-in
# for NVMe that exposes software overhead). Both are ext4 attached with
# --direct-io=on. Every round runs every case; "cold" cases drop the page
# cache first (sync; drop_caches), "warm" ones get an untimed pass first.
#
# The device limit is fio's best on the same bytes (every raw sample's
# extents, in a shuffled order, at queue depth 16, 32 and 64, each with
# and without fio's registered buffers), never a
# replay of the loader's own order (that is shown beside it). bam is also
# compared with fio replaying bam's own 4 KiB requests. The summary
# (bench/compare.py) gives medians and ratios.
#
# Needs root. Usage: bench/run.sh [ROUNDS]   (env: FILES, DEVICES="virtio ram")
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
FILES=${FILES:-12000}
DEVICES=${DEVICES:-virtio ram}
[[ $(id -u) == 0 ]] || { echo "bench: needs root (loop devices, drop_caches)" >&2; exit 1; }
work=$PWD/.bench
mkdir -p "$work"
results=$work/results.jsonl
: > "$results"
daemon= loop= img=
cleanup() {
  if [[ -n $daemon ]]; then kill -TERM "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true; fi
  mountpoint -q "$work/mnt" 2>/dev/null && umount "$work/mnt"
  [[ -n $loop ]] && losetup -d "$loop" 2>/dev/null
  [[ -n $img ]] && rm -f "$img"
  daemon= loop= img=
}
trap cleanup EXIT

drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

for device in $DEVICES; do
  case $device in
    virtio) img=$work/img ;;
    ram) img=/dev/shm/nvfeed-bench.img ;;
    *) echo "bench: unknown device $device (want virtio or ram)" >&2; exit 2 ;;
  esac
  truncate -s 4G "$img"
  mkfs.ext4 -q -F -b 4096 "$img"
  loop=$(losetup --find --show --direct-io=on "$img")
  mkdir -p "$work/mnt" && mount "$loop" "$work/mnt"
  root=$work/mnt/train
  bin/gendataset --out "$root" --files "$FILES" --classes 100 --mean 110000 >/dev/null
  sync
  bin/mkbmap --mountpoint "$root" -o "$work/train.bmap" 2>/dev/null
  bin/mkbmap inspect --format json -o "$work/train.json" "$work/train.bmap" >/dev/null
  nraw=$(.venv/bin/python bench/iolog_shuffled.py --map-json "$work/train.json" --out "$work/shuffled.iolog" --seed 1)
  .venv/bin/python bench/iolog_shuffled.py --map-json "$work/train.json" --out "$work/shuffled4k.iolog" --seed 1 --request 4096 --blocks >/dev/null
  ld() { bin/loaderd bench --bmap "$work/train.bmap" --shuffle --seed 1 --json "$@" 2>/dev/null; }
  ld --batch-size 64 --backend gds --iolog "$work/gds.iolog" >/dev/null
  ld --batch-size 64 --backend bam --cache-mb 0 --iolog "$work/bam.iolog" >/dev/null
  fio() { .venv/bin/python bench/fio_replay.py --iolog "$1" --samples "$FILES" --iodepth "$2" "${@:3}"; }
  py() { .venv/bin/python bench/python_file.py --root "$root" --batch-size 64 --seed "$1"; }
  bin/loaderd serve --socket "$work/loaderd.sock" --dataset "train=$work/train.bmap" 2>"$work/loaderd.log" &
  daemon=$!
  for _ in $(seq 500); do [[ -S $work/loaderd.sock ]] && break; sleep 0.02; done
  shim() { .venv/bin/python python/examples/benchmark.py --batchsize "$1" --json "${@:2}" --socket "$work/loaderd.sock" --dataset train; }
  dali=false
  .venv/bin/python -c 'import nvidia.dali' 2>/dev/null && dali=true
  tag() { python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); r["case"]=sys.argv[1]; r["round"]=int(sys.argv[2]); r["device"]=sys.argv[3]; print(json.dumps(r))' "$@"; }
  for r in $(seq 1 "$ROUNDS"); do
    run() { # cache case command...
      local cache=$1 name=$2; shift 2
      if [[ $cache == cold ]]; then drop; else "$@" >/dev/null; fi
      "$@" | tag "$name $cache" "$r" "$device" >> "$results"
    }
    for cache in cold warm; do
      run $cache "python-file" py "$r"
      run $cache "file b64" ld --batch-size 64
      run $cache "file b16" ld --batch-size 16
      run $cache "shim file b64" shim 64 loader --backend file
      run $cache "shim file b16" shim 16 loader --backend file
    done
    run cold "shim file b64 http" shim 64 loader --backend file --transport http
    run warm "shim file b16 http" shim 16 loader --backend file --transport http
    run cold "file --direct" ld --batch-size 64 --direct
    run cold "gds" ld --batch-size 64 --backend gds
    run cold "bam" ld --batch-size 64 --backend bam --cache-mb 0
    run cold "shim gds b64" shim 64 loader --backend gds
    run cold "shim bam b64" shim 64 loader --backend bam
    for qd in 16 32 64; do
      run cold "fio shuffled qd$qd" fio "$work/shuffled.iolog" $qd
      run cold "fio shuffled qd$qd+fixedbufs" fio "$work/shuffled.iolog" $qd --fixedbufs
    done
    run cold "fio gds order qd32" fio "$work/gds.iolog" 32
    run cold "fio bam requests qd256" fio "$work/bam.iolog" 256
    run cold "fio shuffled 4k qd256" fio "$work/shuffled4k.iolog" 256
    run cold "8 sessions gds" .venv/bin/python bench/sessions.py --socket "$work/loaderd.sock" --sessions 8 --backend gds
    if $dali; then
      run cold "dali readers.file b64" .venv/bin/python python/examples/benchmark.py --batchsize 64 --json dali --datadir "$root"
      run cold "dali external_source gds b64" shim 64 loader-dali --backend gds
    fi
    echo "bench: $device: round $r of $ROUNDS done ($nraw raw samples)" >&2
  done
  cleanup
done
.venv/bin/python bench/compare.py < "$results"
