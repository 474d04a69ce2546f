#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A/B of `loaderd bench` variants on np.save tensors (bench/tensors.sh's
# sets), beside fio replaying the same tensors' data extents (1 MiB
# requests, fixed buffers) at queue depth 4 (fio's best there: 4 MiB of
# buffers) and 64 (64 MiB: a loader-sized destination). Every round runs
# every case cold (sync; drop_caches), one shuffled epoch each, the order
# reversed every other round; medians, spreads and ratios to fio qd4 at
# the end. A case is "LABEL=ARGS": `loaderd bench` flags after --bmap,
# --shuffle, --seed R, --json.
#
# Needs root and fio. Usage: bench/tensor_ab.sh DEVICE ROUNDS CASE...
#   DEVICE: virtio or ram; env SIZE 256k or 16m (default 256k), TOTAL_MB
#   (default 1024), LOADERD (default bin/loaderd)
# Example: bench/tensor_ab.sh ram 7 "b64=--batch-size 64 --backend gds" \
#            "b64 qd128=--batch-size 64 --backend gds --queue-depth 128"
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 3 ]] || { sed -n '3,16p' "$0" >&2; exit 2; }
device=$1 rounds=$2; shift 2
size=${SIZE:-256k} total=${TOTAL_MB:-1024} LOADERD=${LOADERD:-bin/loaderd}
PY=.venv/bin/python
. bench/lib.sh
trap bench_cleanup EXIT
bench_tensor_set "$device" "$PWD/.bench/tensor-ab" "$size" "$total"
w=$bench_work
"$PY" bench/iolog_shuffled.py --map-json "$w/t.json" --out "$w/fio.iolog" --seed 1 --epochs 1 --request 1048576 >/dev/null
out=$w/rates.txt
: >"$out"
gbps() { "$PY" -c 'import json, sys; t = sys.stdin.read(); r = json.loads(t[t.index("{"):]); j = r.get("jobs", [r])[0]
b = j["read"]["io_bytes"] if "read" in j else j["bytes"]; s = j["job_runtime"] / 1000 if "read" in j else j["seconds"]
print(f"{sys.argv[1]}\t{b / s / 1e9:.3f}")' "$1"; }
cases=("$@" "fio qd4=fio 4" "fio qd64=fio 64")
echo "tensor_ab $device $rounds: $n tensors of $size ($total MiB), $(nproc) CPUs, commit $(git rev-parse --short HEAD)"
for r in $(seq "$rounds"); do
  order=("${cases[@]}")
  if ((r % 2 == 0)); then
    order=()
    for ((i = ${#cases[@]} - 1; i >= 0; i--)); do order+=("${cases[i]}"); done
  fi
  for c in "${order[@]}"; do
    label=${c%%=*} args=${c#*=}
    drop
    if [[ $args == fio\ * ]]; then
      fio --name=replay "--read_iolog=$w/fio.iolog" --replay_no_stall=1 --direct=1 --ioengine=io_uring \
        "--iodepth=${args#fio }" --fixedbufs --output-format=json 2>/dev/null | gbps "$label" >>"$out"
    else
      # shellcheck disable=SC2086 # args: bench flags, as words
      "$LOADERD" bench --bmap "$w/t.bmap" --shuffle --seed "$r" --json $args 2>/dev/null | gbps "$label" >>"$out"
    fi
  done
done
"$PY" - "$out" <<'EOF'
import statistics, sys
rates: dict[str, list[float]] = {}
for line in open(sys.argv[1]):
    label, v = line.rstrip("\n").split("\t")
    rates.setdefault(label, []).append(float(v))
ref = statistics.median(rates["fio qd4"])
print(f"{'case':<24} {'GB/s':>7} {'spread':>13} {'vs fio qd4':>11}")
for label, v in rates.items():
    m = statistics.median(v)
    print(f"{label:<24} {m:7.2f} {min(v):6.2f}-{max(v):<6.2f} {m / ref:10.2f}x")
EOF
