#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End to end A/B of two loaderd binaries side by side in one run: both
# daemons serve the same dataset (RAM-backed or virtio ext4, cold: sync;
# drop_caches before every case), and a CPU DALI pipeline
# (fn.external_source(LoaderSource), batch 64, bytes to an operator)
# reads one epoch from each, as root and as nobody (a socket-group member
# in a deployment: the daemon then reads as that user), the order of old
# and new swapped every round. Prints each case's median and rounds.
#
# Needs root. Usage: bench/e2e_ab.sh DEVICE ROUNDS OLD_LOADERD NEW_LOADERD
# (env: FILES, default 12000; BACKENDS, default "file gds"; USERS,
# default "root nobody"; OLD_PYTHON, the python/ folder of the old
# version's client, default this tree's: each daemon is then read by its
# own version's client and benchmark.py)
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -eq 4 ]] || { sed -n '3,13p' "$0" >&2; exit 2; }
device=$1 rounds=$2 old=$3 new=$4
. bench/lib.sh
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null || true; bench_cleanup; }
trap cleanup EXIT
bench_dataset "$device" "$PWD/.bench/e2e_ab"
w=$bench_work out=$w/results.jsonl
: > "$out"
for v in old new; do
  rm -f "$w/$v.sock"
  bin=$old; [[ $v == new ]] && bin=$new
  # 0666: the nobody client connects without a group made for the run.
  "$bin" serve --socket "$w/$v.sock" --socket-mode 0666 --dataset "train=$w/train.bmap" 2>"$w/$v.log" & pids+=($!)
done
while [[ ! -S $w/old.sock || ! -S $w/new.sock ]]; do sleep 0.05; done
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
py=$(.venv/bin/python -c 'import sys; print(f"python{sys.version_info.major}.{sys.version_info.minor}")')
for r in $(seq 1 "$rounds"); do
  order=(old new); (( r % 2 == 0 )) && order=(new old)
  for b in ${BACKENDS:-file gds}; do
    for v in "${order[@]}"; do
      for u in ${USERS:-root nobody}; do
        pydir=$PWD/python
        [[ $v == old ]] && pydir=${OLD_PYTHON:-$PWD/python}
        run=(env "PYTHONPATH=$pydir" .venv/bin/python)
        # nobody cannot run the venv's interpreter when it lives under
        # root's home: the system's, with the venv's packages.
        [[ $u == nobody ]] && run=(setpriv --reuid=65534 --regid=65534 --clear-groups env "PYTHONPATH=$pydir:$site" HOME=/tmp "/usr/bin/$py")
        drop
        "${run[@]}" "$pydir/examples/benchmark.py" --threads 2 --consume operator --json --batchsize 64 \
          loader-dali --socket "$w/$v.sock" --dataset train --backend "$b" |
          .venv/bin/python -c 'import json,sys; r=json.load(sys.stdin); r["case"]=sys.argv[1]; print(json.dumps(r))' "$v $b $u" >> "$out"
      done
    done
  done
  echo "e2e_ab: round $r of $rounds done" >&2
done
.venv/bin/python - "$out" "$device" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cases = {}
for r in rows:
    cases.setdefault(r["case"], []).append(r["samples_per_s"])
print(f"{sys.argv[2]} device, LoaderSource batch 64, bytes to an operator, cold, medians of {len(next(iter(cases.values())))} rounds")
print(f"{'case':<22}{'samples/s':>10}{'new/old':>9}  rounds")
for case, v in sorted(cases.items(), key=lambda kv: (kv[0].split()[1], kv[0].split()[2], kv[0].split()[0] != "old")):
    ver, b, u = case.split()
    ratio = statistics.median(v) / statistics.median(cases[f"old {b} {u}"])
    print(f"{case:<22}{statistics.median(v):>10.0f}{ratio:>8.2f}x  " + " ".join(f"{x:.0f}" for x in v))
PY
