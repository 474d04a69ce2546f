#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Regions of interest: what reading a region of each volume costs against
# reading the whole arrays, in bytes read from the device and in time.
# VOLUMES (default 32) float32 volumes of 256x256x256 (64 MiB each), .npy
# files made by np.save (bench/npy_dataset.py) on an ext4 loop device over
# a file in /dev/shm attached with --direct-io=on (bench/lib.sh: RAM-backed,
# an NVMe stand-in that exposes software overhead), mapped with `mkbmap
# --reader numpy` and served by one `loaderd serve`. Regions, the same for
# every volume (fn.readers.numpy's arguments):
#   whole       no region: the whole arrays
#   crop64      roi_start [96,96,96], roi_end [160,160,160]: a 64^3 crop
#               (1 MiB of 64 MiB: 4096 runs of 256 B, 64 reads once runs
#               closer than the merge gap are joined)
#   slice_z     roi_start [128], roi_end [129], roi_axes [0]: one 2-D slice,
#               256 KiB contiguous
#   slice_y     the same along axis 1: 256 runs of 1 KiB, 256 KiB apart
# Cases, one epoch each (batch 4), cold (sync; drop_caches before each),
# the case order reversed every other round:
#   nvfeed gds / file       LoaderSource(backend=...) through the daemon
#                           (bench/roi_read.py): the region's byte ranges only
#   dali                    fn.readers.numpy (CPU, num_threads 2) with the same
#                           arguments; "dali no_mmap": dont_use_mmap=True
# Each case's bytes read from the device are the loop device's sectors
# read (/sys/block/loopN/stat) while its epoch was timed ("dev w/ open":
# over the whole case, the session's or pipeline's set-up included: a gds
# session's open reads the device too); every case checks the shape of
# every sample it read.
#
# The merge gap (loader/roi.go's roiGap: two runs of a region closer than
# this are read as one read, the gap's bytes too) is swept after: loaderd
# built with each of GAPS (go build -overlay: the tree is not touched),
# nvfeed gds on crop64 (runs 192 KiB apart between z-planes), crop240
# (64x240x64: z-planes 16.75 KiB apart) and slice_y (255 KiB apart).
#
# Needs root, the venv (numpy; DALI for its cases) and go for the sweep.
# Usage: bench/roi.sh [ROUNDS]
#   env: VOLUMES=32, GAPS="4096 65536 1048576" ("" skips the sweep),
#        LOADERD=bin/loaderd
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
VOLUMES=${VOLUMES:-32}
GAPS=${GAPS-4096 65536 1048576}
LOADERD=${LOADERD:-bin/loaderd}
PY=.venv/bin/python
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}  # this tree's client, not an installed one
[[ $(id -u) == 0 ]] || { echo "roi: needs root (loop devices, drop_caches)" >&2; exit 1; }
for t in "$LOADERD" bin/mkbmap; do
  [[ -x $t ]] || { echo "roi: $t missing: make build (or go build -o bin/ ./cmd/...)" >&2; exit 1; }
done
. bench/lib.sh
daemon_pid=''
stop_daemon() { [[ -n $daemon_pid ]] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null; daemon_pid=''; }
trap 'stop_daemon; bench_cleanup' EXIT
work=$PWD/.bench/roi
rm -rf "$work" && mkdir -p "$work"
results=$work/results.jsonl
: >"$results"
dali=false
"$PY" -c 'import nvidia.dali' 2>/dev/null && dali=true
$dali || echo "roi: DALI is not importable from $PY: its cases are skipped" >&2
echo "bash bench/roi.sh $ROUNDS   (VOLUMES=$VOLUMES GAPS=\"$GAPS\"; $(nproc) CPUs," \
  "$("$LOADERD" --version 2>/dev/null | head -1 || echo '?'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"

bench_device ram "$work/dev" "$((VOLUMES * 64 * 115 / 100 + 512))M"
root=$bench_work/mnt/v
echo "roi: writing $VOLUMES volumes of float32 (256,256,256) ..." >&2
"$PY" bench/npy_dataset.py --out "$root" --files "$VOLUMES" --shape 256,256,256 >/dev/null
sync
bin/mkbmap --reader numpy --mountpoint "$root" -o "$work/v.bmap" 2>&1 | sed 's/^/  /' >&2

# serve BINARY: a daemon of BINARY serving the volumes on $work/sock.
serve() {
  stop_daemon
  rm -f "$work/sock"
  "$1" serve --socket "$work/sock" --dataset "volumes=$work/v.bmap" --log-level warn 2>>"$work/loaderd.log" &
  daemon_pid=$!
  for _ in $(seq 100); do [[ -S $work/sock ]] && return; sleep 0.1; done
  echo "roi: $1 serve did not start:" >&2; tail -5 "$work/loaderd.log" >&2; exit 1
}

declare -A ROI=(
  [whole]=''
  [crop64]='{"roi_start": [96, 96, 96], "roi_end": [160, 160, 160]}'
  [crop240]='{"roi_start": [96, 8, 96], "roi_end": [160, 248, 160]}'
  [slice_z]='{"roi_start": [128], "roi_end": [129], "roi_axes": [0]}'
  [slice_y]='{"roi_start": [128], "roi_end": [129], "roi_axes": [1]}'
)
declare -A SHAPE=([whole]=256,256,256 [crop64]=64,64,64 [crop240]=64,240,64 [slice_z]=1,256,256 [slice_y]=256,1,256)

# run_cases SECTION CASE...: ROUNDS rounds of every case (REGION|NAME|ARGS
# of bench/roi_read.py), cold, the order reversed every other round.
run_cases() {
  local section=$1 r c region name args out b0 b1
  shift
  local cases=("$@") order
  for r in $(seq 1 "$ROUNDS"); do
    order=("${cases[@]}")
    if ((r % 2 == 0)); then order=(); for ((i = ${#cases[@]} - 1; i >= 0; i--)); do order+=("${cases[i]}"); done; fi
    for c in "${order[@]}"; do
      IFS='|' read -r region name args <<<"$c"
      drop
      b0=$(dev_read_bytes)
      # shellcheck disable=SC2086 # args is plain words
      if ! out=$("$PY" bench/roi_read.py $args --batch-size 4 --roi "${ROI[$region]}" --expect "${SHAPE[$region]}" \
        --dev "$(basename "$bench_loop")" 2>"$work/case.err"); then
        echo "roi: $section $region $name failed: bench/roi_read.py $args" >&2; tail -5 "$work/case.err" >&2; exit 1
      fi
      b1=$(dev_read_bytes)
      printf '{"section": "%s", "region": "%s", "case": "%s", "round": %d, "dev_bytes": %d, "out": %s}\n' \
        "$section" "$region" "$name" "$r" $((b1 - b0)) "$out" >>"$results"
    done
    echo "roi: $section: round $r of $ROUNDS done" >&2
  done
}

serve "$LOADERD"
cases=()
for region in whole crop64 slice_z slice_y; do
  for b in gds file; do
    cases+=("$region|nvfeed $b|nvfeed --socket $work/sock --dataset volumes --backend $b")
  done
  if $dali; then
    cases+=("$region|dali|dali --root $root" "$region|dali no_mmap|dali --root $root --no-mmap")
  fi
done
run_cases roi "${cases[@]}"
stop_daemon

if [[ -n $GAPS ]]; then
  if ! command -v go >/dev/null; then
    echo "roi: go is not on PATH: the merge-gap sweep is skipped" >&2
  else
    cases=()
    for g in $GAPS; do
      # loader/roi.go with roiGap = g, through an overlay (the tree untouched).
      sed "s/^const roiGap = .*/const roiGap = $g/" loader/roi.go >"$work/roi-$g.go"
      grep -q "^const roiGap = $g\$" "$work/roi-$g.go" || { echo "roi: no 'const roiGap' line in loader/roi.go" >&2; exit 1; }
      printf '{"Replace": {"%s": "%s"}}\n' "$PWD/loader/roi.go" "$work/roi-$g.go" >"$work/overlay-$g.json"
      go build -overlay "$work/overlay-$g.json" -o "$work/loaderd-gap$g" ./cmd/loaderd
    done
    for g in $GAPS; do
      serve "$work/loaderd-gap$g"
      run_cases "gap $g" "crop64|gds|nvfeed --socket $work/sock --dataset volumes --backend gds" \
        "crop240|gds|nvfeed --socket $work/sock --dataset volumes --backend gds" \
        "slice_y|gds|nvfeed --socket $work/sock --dataset volumes --backend gds"
      stop_daemon
    done
  fi
fi
"$PY" bench/roi_read.py summary <"$results"
