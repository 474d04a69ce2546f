#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What a listing costs the daemon at scale (docs/security.md, "What it
# costs", promises 8 and 10): N (default 1 000 000) small files in 1000
# class folders on an ext4 loop device. For each daemon, once its checking
# pass is over: nobody's GET /v1/datasets (its first: every sample opened
# as nobody), again, then after one file is added to a class folder (the
# client gives up at 150 s; the daemon's CPU seconds are counted until it
# is idle again), root's GET, another uid's first GET, then after another
# file is added root's GET first (it pays the shared recount of added),
# nobody's; nobody's session
# opens (LoaderSource, the first batch too); then the read path in
# process, `loaderd bench --as-user nobody` (file and gds: 4000 batches
# of 64 in map order, warm), each build three times in turn. Each line names what it measured; times are wall seconds, cpu the
# daemon's user+system seconds (/proc/PID/stat).
#
# Several daemons side by side on the same files and map (an A/B):
# LOADERDS="before=/tmp/old/loaderd after=bin/loaderd". With WORK holding
# train.bmap and mnt/train already (a dataset made by an earlier run), they
# are used as they are. Needs root, curl and setpriv, and about 10 GB of
# disk for the image (sparse).
# Usage: bench/listing.sh [ROUNDS]   (env: N, WORK, LOADERDS, default "loaderd=bin/loaderd")
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-1000000}
ROUNDS=${1:-1}
read -r -a daemons <<< "${LOADERDS:-loaderd=bin/loaderd}"
w=${WORK:-$PWD/.bench/listing}; mkdir -p "$w"
made=
if [[ ! -f $w/train.bmap ]]; then
  truncate -s 10G "$w/img"; mkfs.ext4 -q -F -b 4096 -N $((N + N / 5)) "$w/img"
  loop=$(losetup --find --show "$w/img"); mkdir -p "$w/mnt"; mount "$loop" "$w/mnt"; made=$loop
  nice bin/gendataset --out "$w/mnt/train" --files "$N" --classes 1000 --mean 1000 --sigma 0.3 >/dev/null; sync
  nice bin/mkbmap --mountpoint "$w/mnt/train" -o "$w/train.bmap" 2>&1 | tail -1
fi
root=$w/mnt/train
run=$(mktemp -d /tmp/listing.XXXXXX); chmod 755 "$run"
dpid=
cleanup() {
  set +e
  [[ -n $dpid ]] && kill -TERM "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null
  rm -f "$root"/*/listing-added-*.JPEG
  rm -rf "$run"
  if [[ -n $made ]]; then umount "$w/mnt"; losetup -d "$made"; rm -f "$w/img" "$w/train.bmap"; fi
}
trap cleanup EXIT
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
cpu() { awk -v t="$(getconf CLK_TCK)" '{printf "%.2f\n", ($14+$15)/t}' "/proc/$dpid/stat"; }
# get LABEL UID WHAT: one GET /v1/datasets as UID (the client gives up at 150 s).
get() {
  local c0 t0 code; c0=$(cpu); t0=$(now)
  code=$(setpriv --reuid "$2" --regid "$2" --clear-groups curl -s -o /dev/null -w '%{http_code}' --max-time 150 \
    --unix-socket "$run/d.sock" http://d/v1/datasets || true)
  local t; t=$(since "$t0")
  local c1; c1=$(cpu)
  local c2=$c1; while :; do sleep 1; c2=$(cpu); [[ $(echo "$c2 - $c1 < 0.05" | bc) == 1 ]] && break; c1=$c2; done
  echo "$1: GET /v1/datasets as uid $2, $3: answer $code in $t s; daemon cpu $(echo "$c2 - $c0" | bc) s until idle"
}
# opens LABEL: nobody's session opens and first batches (LoaderSource, file backend).
opens() {
  setpriv --reuid 65534 --regid 65534 --clear-groups .venv/bin/python - "$run/d.sock" <<'PY' | sed "s/^/$1: /"
import sys, time
from nvfeed import LoaderSource
for k in range(3):
    t0 = time.monotonic()
    with LoaderSource("train", socket=sys.argv[1], batch_size=64, random_shuffle=True, seed=k, backend="file") as s:
        t1 = time.monotonic(); next(s); t2 = time.monotonic()
    print(f"session open as nobody: {t1 - t0:.3f} s, first batch {t2 - t1:.3f} s after it", flush=True)
PY
}
serve() { # LABEL BINARY
  local label=$1 bin=$2
  rm -f "$run/d.sock"
  "$bin" serve --socket "$run/d.sock" --socket-mode 0666 --dataset "train=$w/train.bmap" 2>"$run/d-$label.log" & dpid=$!
  while ! grep -q "dataset checked" "$run/d-$label.log"; do sleep 0.5; kill -0 "$dpid"; done
  get "$label" 65534 "its first"
  get "$label" 65534 "again"
  local cls; cls=$(find "$root" -mindepth 1 -maxdepth 1 -type d -printf "%f\n" | sort | head -1)
  echo added > "$root/$cls/listing-added-$label.JPEG"
  get "$label" 65534 "after one file added"
  get "$label" 0 "after one file added"
  get "$label" 43117 "its first, after one file added"
  sleep 5 # past the counts' 5 s: root's GET counts them again
  local cls2; cls2=$(find "$root" -mindepth 1 -maxdepth 1 -type d -printf "%f\n" | sort | sed -n 2p)
  echo added > "$root/$cls2/listing-added-$label.JPEG"
  get "$label" 0 "first after another file added"
  get "$label" 65534 "after another file added"
  opens "$label"
  rm -f "$root/$cls/listing-added-$label.JPEG" "$root/$cls2/listing-added-$label.JPEG"
  kill -TERM "$dpid"; wait "$dpid" 2>/dev/null || true; dpid=
}
readpath() { # LABEL BINARY: 4000 batches of 64 in map order, warm (every build reads the same)
  for be in file gds; do
    printf '%s: loaderd bench --as-user nobody --backend %s: ' "$1" "$be"
    "$2" bench --bmap "$w/train.bmap" --backend "$be" --as-user nobody --batches 4000 2>/dev/null |
      awk -v be="$be" '$1 == be && $2 ~ /^[0-9]+$/ {print $5 " samples/s, cpu " $9 " s"}'
  done
}
for r in $(seq 1 "$ROUNDS"); do
  order=("${daemons[@]}")
  if (( r % 2 == 0 )); then order=(); for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do order+=("${daemons[i]}"); done; fi
  for d in "${order[@]}"; do serve "${d%%=*}" "${d#*=}"; done
  readpath warm-up "${daemons[0]#*=}" >/dev/null
  for k in 1 2 3; do for d in "${order[@]}"; do readpath "${d%%=*}" "${d#*=}"; done; done
done
