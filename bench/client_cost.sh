#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# CPU per batch, warm page cache, RAM-backed device: `loaderd bench` alone
# against the same batches served by a daemon to LoaderSource (the
# daemon's CPU from /proc/PID/stat, the client's from getrusage), ROUNDS
# alternating rounds; then the client's Python alone with no daemon
# (bench/client_cost.py --synthetic).
#
# Needs root. Usage: bench/client_cost.sh [BATCH] [ROUNDS] [BACKEND]
# (env: FILES, default 4000)
set -euo pipefail
cd "$(dirname "$0")/.."
bs=${1:-16} rounds=${2:-3} be=${3:-file}
export FILES=${FILES:-4000}
. bench/lib.sh
d=
cleanup() { [[ -n $d ]] && { kill -TERM "$d"; wait "$d" || true; }; bench_cleanup; }
trap cleanup EXIT
bench_dataset ram "$PWD/.bench/clientcost"
w=$bench_work n=$((3 * FILES / bs))
rm -f "$w/d.sock"
bin/loaderd serve --socket "$w/d.sock" --dataset "train=$w/train.bmap" 2>"$w/loaderd.log" & d=$!
while [[ ! -S $w/d.sock ]]; do sleep 0.02; done
ticks() { awk '{print $14, $15}' "/proc/$d/stat"; }
hz=$(getconf CLK_TCK)
.venv/bin/python bench/client_cost.py "$w/d.sock" "$bs" "$n" "$be" >/dev/null # warm the page cache
for _ in $(seq "$rounds"); do
  /usr/bin/time -f "%U %S %e" -o "$w/time" bin/loaderd bench --bmap "$w/train.bmap" --backend "$be" --batch-size "$bs" \
    --shuffle --epochs 3 --json >/dev/null 2>&1
  read -r u s e < "$w/time"
  read -r du0 ds0 < <(ticks)
  c=$(.venv/bin/python bench/client_cost.py "$w/d.sock" "$bs" "$n" "$be")
  read -r du1 ds1 < <(ticks)
  .venv/bin/python - "$u" "$s" "$e" "$du0" "$ds0" "$du1" "$ds1" "$hz" "$n" "$c" <<'PY'
import json, sys
u, s, e, du0, ds0, du1, ds1, hz, n = map(float, sys.argv[1:10])
c = json.loads(sys.argv[10])
us = lambda x: x / n * 1e6
print(f"loaderd bench: CPU {us(u):.0f} user + {us(s):.0f} sys, wall {us(e):.0f} µs/batch | served: daemon "
      f"{us((du1 - du0) / hz):.0f} user + {us((ds1 - ds0) / hz):.0f} sys, client {c['user_us']:.0f} user + "
      f"{c['sys_us']:.0f} sys, wall {c['wall_us']:.0f} µs/batch")
PY
done
for b in "$bs" 64; do .venv/bin/python bench/client_cost.py --synthetic "$b"; done
