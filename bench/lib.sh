# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Shared by the bench scripts (sourced): one ImageNet-shaped dataset on a
# loop device and its daemon, cleaned up at exit.
#
# bench_dataset DEVICE WORK: DEVICE virtio (an image under WORK) or ram (an
# image in /dev/shm); makes an ext4 loop device attached with
# --direct-io=on (bench_device), FILES (default 12000) files of ~110 KB
# under WORK/mnt/train and their map WORK/train.bmap. Needs root.
bench_loop='' bench_img='' bench_work='' bench_daemon=''
bench_cleanup() {
  [[ -n $bench_daemon ]] && { kill -TERM "$bench_daemon" 2>/dev/null; wait "$bench_daemon" 2>/dev/null || true; }
  bench_daemon=''
  [[ -n $bench_work ]] && mountpoint -q "$bench_work/mnt" 2>/dev/null && umount "$bench_work/mnt"
  [[ -n $bench_loop ]] && losetup -d "$bench_loop" 2>/dev/null
  [[ -n $bench_img ]] && rm -f "$bench_img"
  bench_loop='' bench_img=''
}
bench_dataset() {
  bench_device "$1" "$2" 4G
  bin/gendataset --out "$bench_work/mnt/train" --files "${FILES:-12000}" --classes 100 --mean 110000 >/dev/null
  sync
  bin/mkbmap --mountpoint "$bench_work/mnt/train" -o "$bench_work/train.bmap" 2>/dev/null
}
# bench_device DEVICE WORK SIZE: the empty filesystem alone (SIZE as
# truncate takes it), mounted at WORK/mnt, its loop device in $bench_loop.
bench_device() {
  local device=$1 size=$3
  bench_work=$2
  [[ $(id -u) == 0 ]] || { echo "bench: needs root (loop devices, drop_caches)" >&2; exit 1; }
  mkdir -p "$bench_work"
  case $device in
    virtio) bench_img=$bench_work/img ;;
    ram) bench_img=/dev/shm/nvfeed-$(basename "$bench_work").img ;;
    *) echo "bench: unknown device $device (want virtio or ram)" >&2; exit 2 ;;
  esac
  truncate -s "$size" "$bench_img"
  mkfs.ext4 -q -F -b 4096 "$bench_img"
  bench_loop=$(losetup --find --show --direct-io=on "$bench_img")
  mkdir -p "$bench_work/mnt" && mount "$bench_loop" "$bench_work/mnt"
}
# bench_tensor_set DEVICE WORK SIZE TOTAL_MB: np.save float32 tensors of
# SIZE (256k: 256x256, batch 64; 16m: 2048x2048, batch 8), TOTAL_MB of
# them in whole batches, on a filesystem of their own (bench_device) at
# WORK/mnt/t, mapped to WORK/t.bmap and inspected to WORK/t.json. Sets
# shape, batch, tbytes (a tensor's data bytes) and n (the files).
bench_tensor_set() {
  local device=$1 work=$2 size=$3 total=$4
  case $size in
    256k) shape=256,256 batch=64 tbytes=262144 ;;
    16m) shape=2048,2048 batch=8 tbytes=16777216 ;;
    *) echo "bench: unknown tensor size $size (want 256k or 16m)" >&2; exit 2 ;;
  esac
  n=$((total * 1048576 / tbytes / batch * batch))
  bench_device "$device" "$work" "$((total * 115 / 100 + 512))M"
  echo "bench: $device, $size: writing $n files of float32 ($shape) ..." >&2
  .venv/bin/python bench/npy_dataset.py --out "$bench_work/mnt/t" --files "$n" --shape "$shape" >/dev/null
  sync
  bin/mkbmap --reader numpy --mountpoint "$bench_work/mnt/t" -o "$bench_work/t.bmap" 2>&1 | sed 's/^/  /' >&2
  bin/mkbmap inspect --format json -o "$bench_work/t.json" "$bench_work/t.bmap" >/dev/null
}
# dev_read_bytes: bytes read from $bench_loop so far (its sysfs stat).
dev_read_bytes() {
  local s
  read -r _ _ s _ < "/sys/block/$(basename "$bench_loop")/stat"
  echo $((s * 512))
}
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# bench_serve SOCKET LOG ARGS...: starts ${LOADERD:-bin/loaderd} serve on
# SOCKET (its log in LOG) with ARGS, its pid in $bench_daemon, and waits
# for the socket (printing the log and exiting if the daemon died).
bench_serve() {
  local socket=$1 log=$2
  rm -f "$socket"
  "${LOADERD:-bin/loaderd}" serve --socket "$socket" "${@:3}" 2>"$log" & bench_daemon=$!
  while [[ ! -S $socket ]]; do kill -0 "$bench_daemon" || { cat "$log"; exit 1; }; sleep 0.02; done
}
