#!/usr/bin/env bash
# Side-by-side read benchmark on one ImageNet-shaped dataset (~12 000 files,
# lognormal around 110 KB) on a loop-mounted ext4 image attached with
# --direct-io=on. Each round runs every case cold (sync; drop_caches), and
# the page-cache users warm too; the summary gives medians and ratios to
# the Python reference. fio replays exactly the gds backend's reads (same
# byte ranges, same order, same engine and queue depth).
# Needs root. Usage: bench/run.sh [ROUNDS]   (env: FILES, BATCH)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
FILES=${FILES:-12000}
BATCH=${BATCH:-64}
[[ $(id -u) == 0 ]] || { echo "bench: needs root (loop devices, drop_caches)" >&2; exit 1; }
work=$PWD/.bench
mkdir -p "$work"
cleanup() {
  if [[ -n ${daemon:-} ]]; then kill -TERM "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true; fi
  mountpoint -q "$work/mnt" 2>/dev/null && umount "$work/mnt"
  [[ -n ${loop:-} ]] && losetup -d "$loop" 2>/dev/null
  rm -f "$work/img"
}
trap cleanup EXIT
truncate -s 4G "$work/img"
mkfs.ext4 -q -F -b 4096 "$work/img"
loop=$(losetup --find --show --direct-io=on "$work/img")
mkdir -p "$work/mnt" && mount "$loop" "$work/mnt"
root=$work/mnt/train
bin/gendataset --out "$root" --files "$FILES" --classes 100 --mean 110000
sync
bin/mkbmap --mountpoint "$root" -o "$work/train.bmap"

drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
tag() { python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); r["case"]=sys.argv[1]; r["round"]=int(sys.argv[2]); print(json.dumps(r))' "$@"; }
py() { .venv/bin/python bench/python_file.py --root "$root" --batch-size "$BATCH" --seed "$1"; }
ld() { bin/loaderd bench --bmap "$work/train.bmap" --batch-size "$BATCH" --shuffle --seed "$1" --json "${@:2}" 2>/dev/null; }
QD=${QD:-32}
# The gds backend's reads for seed 1, as a fio replay log.
ld 1 --backend gds --queue-depth "$QD" --iolog "$work/gds.iolog" > /dev/null
fio_replay() { .venv/bin/python bench/fio_replay.py --iolog "$work/gds.iolog" --samples "$FILES" --iodepth "$QD"; }

# The Python shim through a real daemon, on the same map and backends.
sock=$work/loaderd.sock
bin/loaderd serve --socket "$sock" --dataset "train=$work/train.bmap" 2>"$work/loaderd.log" &
daemon=$!
for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.05; done
shim() { .venv/bin/python python/examples/benchmark.py --batchsize "$BATCH" --json loader --socket "$sock" --dataset train --backend "$1"; }

results=$work/results.jsonl
: > "$results"
for r in $(seq 1 "$ROUNDS"); do
  for cache in cold warm; do
    run() { # case, command...
      local name=$1; shift
      [[ $cache == cold ]] && drop || "$@" >/dev/null   # warm: one untimed pass first
      "$@" | tag "$name $cache" "$r" >> "$results"
    }
    run "python-file" py "$r"
    run "file" ld 1
    run "shim file" shim file
    [[ $cache == warm ]] && continue   # the rest bypass the page cache
    run "file --direct" ld 1 --direct
    run "gds" ld 1 --backend gds --queue-depth "$QD"
    run "bam" ld 1 --backend bam
    run "shim gds" shim gds
    run "shim bam" shim bam
    run "fio (gds reads)" fio_replay
  done
  echo "bench: round $r of $ROUNDS done" >&2
done
.venv/bin/python bench/compare.py < "$results"
