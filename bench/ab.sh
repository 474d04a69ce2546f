#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A/B of `loaderd bench` variants on one dataset, side by side in one run:
# every round runs every case cold (sync; drop_caches), the order of the
# cases reversed every other round; bench/compare.py-style medians at the
# end. A case is "LABEL=BINARY bench ARGS..." (BINARY: a loaderd; ARGS: its bench
# flags after --bmap, --shuffle, --seed 1, --json). The ratio is to the
# first case, or for a case labelled after-X to the case before-X.
#
# Needs root. Usage: bench/ab.sh DEVICE ROUNDS CASE...   (DEVICE: virtio or
# ram; env: FILES, default 12000)
# Example: bench/ab.sh ram 5 "sorted=bin/loaderd bench --backend gds" \
#            "issue=/tmp/loaderd-issueorder bench --backend gds"
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 3 ]] || { sed -n '3,13p' "$0" >&2; exit 2; }
device=$1 rounds=$2; shift 2
. bench/lib.sh
trap bench_cleanup EXIT
bench_dataset "$device" "$PWD/.bench/ab"
work=$bench_work
out=$work/results.jsonl
: > "$out"
cases=("$@")
for r in $(seq 1 "$rounds"); do
  order=("${cases[@]}")
  if (( r % 2 == 0 )); then
    order=()
    for ((i = ${#cases[@]} - 1; i >= 0; i--)); do order+=("${cases[i]}"); done
  fi
  for c in "${order[@]}"; do
    label=${c%%=*} cmd=${c#*=}
    drop
    # shellcheck disable=SC2086 # cmd is a binary and its flags
    $cmd --bmap "$work/train.bmap" --shuffle --seed 1 --json 2>/dev/null |
      python3 -c 'import json,sys; r=json.load(sys.stdin); r["case"]=sys.argv[1]; r["round"]=int(sys.argv[2]); print(json.dumps(r))' "$label" "$r" >> "$out"
  done
done
python3 - "$out" "$device" <<'EOF'
import json, statistics, sys
sys.path.insert(0, "bench")
from rounds import by_round, ratio
rows = [json.loads(l) for l in open(sys.argv[1])]
cases = list(dict.fromkeys(r["case"] for r in rows))
base = None
print(f"device {sys.argv[2]}, cold, medians of {len(rows) // len(cases)} rounds")
print(f"{'case':<24}{'samples/s':>11}{'ratio':>8}{'CPU s/GB':>10}  rounds")
def median(c):
    return statistics.median(r["samples_per_s"] for r in rows if r["case"] == c)
for c in cases:
    rs = [r for r in rows if r["case"] == c]
    sps = median(c)
    cpu = statistics.median(r["cpu_seconds"] / (r["bytes"] / 1e9) for r in rs)
    base = base or sps
    # an after-X case is shown against its own before-X case
    against, vs = (median("before-" + c[6:]), "  (vs before)") if c.startswith("after-") and "before-" + c[6:] in cases else (base, "")
    each = " ".join(f"{r['samples_per_s']:.0f}" for r in rs)
    print(f"{c:<24}{sps:>11.0f}{sps / against:>7.2f}x{cpu:>10.3f}  {each}{vs}")
    if vs:  # the same ratio round by round: its spread says whether it is within noise
        f = ratio(by_round(rs, "samples_per_s"), by_round([r for r in rows if r["case"] == "before-" + c[6:]], "samples_per_s"))
        print(f"{'':<24}by round, vs before: {f.text()}x over {f.rounds} rounds")
EOF
