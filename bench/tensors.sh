#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Tensor datasets: .npy files made by np.save, read cold into host memory,
# side by side in one run. Two sample sizes (256 KiB: float32 256x256;
# 16 MiB: float32 2048x2048; TOTAL_MB of data each, default 4096), each on
# its own ext4 loop device attached with --direct-io=on (bench/lib.sh):
# over a file on the VM's virtio disk, and over a file in /dev/shm (RAM-
# backed: an NVMe stand-in that exposes software overhead). Mapped with
# `mkbmap --reader numpy`. Cases, every one reading the same tensors in a
# shuffled order (a full permutation), the page cache dropped before each
# (sync; drop_caches), the order reversed every other round:
#   loaderd gds / file / file --direct   `loaderd bench` into its pinned
#                                   batch memory (memfd, mlocked)
#   dali readers.numpy (+ o_direct)    a DALI pipeline of fn.readers.numpy
#                                   alone (CPU, num_threads 2,
#                                   shuffle_after_epoch), returning batches
#   np.load loop                    np.load of every file, one by one
#   fio REQ qdN [fixedbufs]         fio replaying every tensor's data extents
#                                   (4 KiB-rounded, split at REQ), shuffled,
#                                   O_DIRECT, io_uring: "fio best" is the
#                                   best median, the device's limit for
#                                   these bytes
#   pread ring qd4 4MiB / 512MiB    the same reads (1 MiB) by 4 threads into a
#                                   destination of 4 MiB (fio's buffers at
#                                   qd 4: they stay in the CPU's cache) or
#                                   512 MiB (loader-sized: every tensor in
#                                   its own place, as batches are); on the
#                                   RAM device the kernel's copy into cached
#                                   buffers is cheaper (bench/pread_ring.py)
# The summary (bench/tensor_compare.py) gives medians of ROUNDS, their
# spread, each case's ratio to fn.readers.numpy, np.load and fio best, the
# bytes the device really read per data byte (dev/data), and the goals
# (RAM device, 16 MiB tensors: loaderd gds >= 1.5x fn.readers.numpy, >=
# 0.9x fio best). The machine is shared and has 2 cores: single runs are
# noisy, read the medians and ratios.
#
# A loaderd that refuses tensor maps (one older than tensor serving) has
# its cases skipped, said so in the table; the references still run.
#
# Needs root, fio, and the venv (numpy; DALI for its cases).
# Usage: bench/tensors.sh [ROUNDS]
#   env: DEVICES="virtio ram", SIZES="256k 16m", TOTAL_MB=4096,
#        FIO_256k="1m:4 1m:16 1m:64", FIO_16m="256k:16 1m:4 1m:16 4m:4"
#        (REQ:QD, each run with and without --fixedbufs), LOADERD=bin/loaderd
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
DEVICES=${DEVICES:-virtio ram}
SIZES=${SIZES:-256k 16m}
TOTAL_MB=${TOTAL_MB:-4096}
LOADERD=${LOADERD:-bin/loaderd}
PY=.venv/bin/python
[[ $(id -u) == 0 ]] || { echo "tensors: needs root (loop devices, drop_caches)" >&2; exit 1; }
command -v fio >/dev/null || { echo "tensors: needs fio" >&2; exit 1; }
for t in "$LOADERD" bin/mkbmap; do
  [[ -x $t ]] || { echo "tensors: $t missing: make build (or go build -o bin/ ./cmd/...)" >&2; exit 1; }
done
. bench/lib.sh
trap bench_cleanup EXIT
work=$PWD/.bench/tensors
mkdir -p "$work"
results=$work/results.jsonl
: >"$results"
dali=false
"$PY" -c 'import nvidia.dali' 2>/dev/null && dali=true
$dali || echo "tensors: DALI is not importable from $PY: its cases are skipped" >&2
echo "bash bench/tensors.sh $ROUNDS   (DEVICES=\"$DEVICES\" SIZES=\"$SIZES\" TOTAL_MB=$TOTAL_MB;" \
  "$(nproc) CPUs, $("$LOADERD" --version 2>/dev/null | head -1 || echo '?'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"

skip() { # CASE DEVICE SIZE REASON
  "$PY" bench/tensor_compare.py skip --case "$1" --device "$2" --size "$3" --why "$4" >>"$results"
}

for device in $DEVICES; do
  for size in $SIZES; do
    fios=FIO_$size
    fios=${!fios:-$([[ $size == 16m ]] && echo "256k:16 1m:4 1m:16 4m:4" || echo "1m:4 1m:16 1m:64")}
    bench_tensor_set "$device" "$work/$device-$size" "$size" "$TOTAL_MB"
    w=$bench_work root=$bench_work/mnt/t
    rm -f "$w"/fio-*.iolog
    for f in $fios 1m:0; do  # 1m: pread_ring.py's log
      req=${f%%:*}
      [[ -e $w/fio-$req.iolog ]] || "$PY" bench/iolog_shuffled.py --map-json "$w/t.json" --out "$w/fio-$req.iolog" --seed 1 \
        --request "$(numfmt --from=iec "${req^^}")" >/dev/null
    done
    cases=()
    # loaderd: skipped, with the reason, where it refuses tensor maps.
    if err=$("$LOADERD" bench --bmap "$w/t.bmap" --batch-size "$batch" --batches 1 --json 2>&1 >/dev/null); then
      cases+=("loaderd gds|$LOADERD bench --bmap $w/t.bmap --batch-size $batch --shuffle --seed @R --json --backend gds"
              "loaderd file|$LOADERD bench --bmap $w/t.bmap --batch-size $batch --shuffle --seed @R --json --backend file"
              "loaderd file --direct|$LOADERD bench --bmap $w/t.bmap --batch-size $batch --shuffle --seed @R --json --backend file --direct")
    else
      why=$(printf '%s\n' "$err" | grep -v '^usage:\|--help' | tail -1)
      [[ $err == *"not served"* ]] && why="this loaderd refuses tensor maps (loader.ErrTensorMap: it predates tensor serving)"
      echo "tensors: loaderd cases skipped: $why" >&2
      for c in "loaderd gds" "loaderd file" "loaderd file --direct"; do skip "$c" "$device" "$size" "$why"; done
    fi
    if $dali; then
      cases+=("dali readers.numpy|$PY bench/tensor_read.py dali --root $root --batch-size $batch --seed @R"
              "dali readers.numpy o_direct|$PY bench/tensor_read.py dali --root $root --batch-size $batch --seed @R --o-direct")
    else
      skip "dali readers.numpy" "$device" "$size" "DALI is not importable"
    fi
    cases+=("np.load loop|$PY bench/tensor_read.py npload --root $root --seed @R")
    for f in $fios; do
      req=${f%%:*} qd=${f#*:}
      cases+=("fio $req qd$qd|$PY bench/fio_replay.py --iolog $w/fio-$req.iolog --samples $n --iodepth $qd"
              "fio $req qd$qd fixedbufs|$PY bench/fio_replay.py --iolog $w/fio-$req.iolog --samples $n --iodepth $qd --fixedbufs")
    done
    for mib in 4 512; do
      cases+=("pread ring qd4 ${mib}MiB|$PY bench/pread_ring.py --iolog $w/fio-1m.iolog --samples $n --iodepth 4 --footprint $mib")
    done
    for r in $(seq 1 "$ROUNDS"); do
      order=("${cases[@]}")
      if ((r % 2 == 0)); then order=(); for ((i = ${#cases[@]} - 1; i >= 0; i--)); do order+=("${cases[i]}"); done; fi
      for c in "${order[@]}"; do
        name=${c%%|*} cmd=${c#*|}
        drop
        b0=$(dev_read_bytes)
        # shellcheck disable=SC2086 # cmd is a command line of plain words
        if ! out=$(${cmd//@R/$r} 2>"$w/case.err"); then
          echo "tensors: $device $size: $name failed: ${cmd//@R/$r}" >&2; tail -5 "$w/case.err" >&2; exit 1
        fi
        b1=$(dev_read_bytes)
        printf '%s\n' "$out" | "$PY" bench/tensor_compare.py tag --case "$name" --round "$r" --device "$device" \
          --size "$size" --dev-bytes $((b1 - b0)) --tensor-bytes "$tbytes" --shape "$shape" --batch "$batch" \
          --files "$n" >>"$results"
      done
      echo "tensors: $device, $size: round $r of $ROUNDS done" >&2
    done
    bench_cleanup
  done
done
"$PY" bench/tensor_compare.py summary <"$results"
