#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Start-up at ImageNet scale: N (default 1 281 167) small files (the count
# matters here, not the bytes) on an ext4 loop device, cold: mkbmap, the
# daemon ready, 8 ranks' first batches, the daemon's memory. Needs root and
# about 12 GB of disk for the image (sparse).
#
# Several daemons side by side on the same files and map (an A/B: each
# round starts each daemon cold, in turn, the order reversed every other
# round): LOADERDS="before=/tmp/old/loaderd after=bin/loaderd".
# Each daemon's last lines: the median over the rounds, with their spread
# (bench/rounds.py), of its ready time and of a round's slowest first
# batch; bench/results.py reads those.
# Usage: bench/scale.sh [ROUNDS]   (env: N, LOADERDS, default "loaderd=bin/loaderd")
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-1281167}
ROUNDS=${1:-1}
read -r -a daemons <<< "${LOADERDS:-loaderd=bin/loaderd}"
w=$PWD/.bench/scale; mkdir -p $w
truncate -s 12G $w/img; mkfs.ext4 -q -F -b 4096 -N 1400000 $w/img
loop=$(losetup --find --show --direct-io=on $w/img); mkdir -p $w/mnt; mount $loop $w/mnt
dpid=
cleanup() { # every step runs whatever the one before it did (set -e stops a trap at its first failure)
  set +e
  [[ -n $dpid ]] && kill -TERM $dpid 2>/dev/null
  pkill -f "$w/rank.py" 2>/dev/null
  wait 2>/dev/null
  umount $w/mnt 2>/dev/null || umount -l $w/mnt
  losetup -d $loop
  rm -f $w/img
}
trap cleanup EXIT
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
t0=$(now); bin/gendataset --out $w/mnt/train --files $N --classes 1000 --mean 2000 --sigma 0.3 >/dev/null; sync
echo "gendataset: $(since $t0) s"
sync; echo 3 > /proc/sys/vm/drop_caches
t0=$(now); bin/mkbmap --mountpoint $w/mnt/train -o $w/train.bmap 2>&1 | tail -1
echo "mkbmap cold: $(since $t0) s"
cat > $w/rank.py <<'PY'
import sys, time
from nvfeed import LoaderSource
t0 = time.monotonic()
with LoaderSource("train", socket=sys.argv[1], batch_size=64, shard_id=int(sys.argv[2]), num_shards=8, random_shuffle=True, backend="gds") as s:
    t1 = time.monotonic(); next(s); t2 = time.monotonic()
    print(f"rank {sys.argv[2]}: open {t1-t0:.3f} s, first batch {t2-t0:.3f} s after asking", flush=True)
    sys.stdin.readline()
PY
run() { # LABEL BINARY
  local label=$1 bin=$2
  rm -f $w/d.sock
  sync; echo 3 > /proc/sys/vm/drop_caches
  local t0; t0=$(now)
  $bin serve --socket $w/d.sock --dataset train=$w/train.bmap 2>$w/d-$label.log & dpid=$!
  while [[ ! -S $w/d.sock ]]; do sleep 0.01; done
  echo "$label: daemon ready (cold): $(since $t0) s" | tee -a $w/rounds.txt
  grep "registered" $w/d-$label.log | head -2 || true
  echo "$label: daemon RSS idle: $(grep VmRSS /proc/$dpid/status)"
  local pids=()
  for k in 0 1 2 3 4 5 6 7; do
    (sleep 30 | .venv/bin/python $w/rank.py $w/d.sock $k | sed "s/^/$label: /" | tee -a $w/rounds.txt) & pids+=($!)
  done
  sleep 12
  echo "$label: daemon RSS with 8 sessions: $(grep VmRSS /proc/$dpid/status)"
  wait "${pids[@]}" || true
  kill -TERM $dpid; wait $dpid 2>/dev/null || true; dpid=
}
: > $w/rounds.txt
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r" >> $w/rounds.txt
  order=("${daemons[@]}")
  if (( r % 2 == 0 )); then order=(); for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do order+=("${daemons[i]}"); done; fi
  for d in "${order[@]}"; do run "${d%%=*}" "${d#*=}"; done
done
.venv/bin/python - $w/rounds.txt <<'PY'
import re, sys
sys.path.insert(0, "bench")
from rounds import figure
ready, first, r = {}, {}, 0
for line in open(sys.argv[1]):
    if m := re.match(r"round (\d+)", line):
        r = int(m[1])
    elif m := re.match(r"(\S+): daemon ready \(cold\): ([\d.]+) s", line):
        ready.setdefault(m[1], []).append(float(m[2]))
    elif m := re.match(r"(\S+): rank \d+: open [\d.]+ s, first batch ([\d.]+) s", line):
        first.setdefault(m[1], {}).setdefault(r, []).append(float(m[2]))
for label, xs in ready.items():
    print(f"{label}: median daemon ready (cold): {figure(xs).text(3)} s over {len(xs)} rounds")
    slowest = figure(max(v) for v in first.get(label, {}).values())
    print(f"{label}: median 8 ranks' first batch (the slowest of a round): {slowest.text(3)} s over {slowest.rounds} rounds")
PY
