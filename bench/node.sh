#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A training node's shape: one training process per GPU, each with its own
# session, all at once on one device. On the RAM-backed ext4 loop device
# (--direct-io=on; FILES, default 12 000 ImageNet-shaped files), each
# round, cold (sync; drop_caches before each case), the order reversed
# every other round:
#  - 8 ranks, batch 64: 8 processes as the unprivileged user nobody in the
#    daemon's socket group (setpriv; the group as deployed: `loaderd` where
#    it exists, else an unused gid), one LoaderSource each (shard r of 8,
#    no backend named: the daemon's default), opened, then from a barrier
#    reading 3 shuffled epochs at once (bench/sessions.py --open-first):
#    aggregate samples/s, CPU per sample of the daemon (/proc/PID/stat) and
#    of the clients (getrusage), over the reading; and the rate after the
#    first epoch, without what a session pays once;
#  - fio's best replay of the same bytes: every sample's extents, 3 epochs
#    each shuffled anew (bench/iolog_shuffled.py), at the same total queue
#    depth (8 x QD, QD the default backend's queue_depth, 32), with and
#    without registered buffers, the better of the two each round
#    (bench/fio_replay.py); that one's own CPU per sample beside the
#    loader's;
#  - 8 ranks, batch 16: the same, CPU per batch;
#  - 8 ranks, batch 64, huge pages: the first case with HUGEPAGES (default
#    1024) 2 MiB pages reserved for its run (vm.nr_hugepages, put back
#    after), so each session's batch memory is a hugetlb memfd, as
#    docs/daemon.md's deployment advises; the daemon's log must say so for
#    all 8 sessions, else the case fails. The pool is touched once before
#    the case, as on a node whose pool has served before: on this VM a
#    huge page's first touch ever costs 2.3 s/GB (the hypervisor backing
#    it), 0.042 s/GB after (docs/decisions.md).
# The daemon runs as deployed: socket group and mode 0660, the freshness
# guard and the access checks on (no flag turns them off here).
# Figures: medians of ROUNDS with their spread, ratios round by round
# (bench/rounds.py); the "goal:" lines are read by bench/results.py.
#
# Needs root. Usage: bench/node.sh [ROUNDS]   (env: FILES, QD, SOCKET_GID, HUGEPAGES)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
qd=${QD:-32}
. bench/lib.sh
trap bench_cleanup EXIT
py=.venv/bin/python
gid=${SOCKET_GID:-$( (getent group loaderd || true) | cut -d: -f3)}
if [[ -z $gid ]]; then  # an unused gid: no group file is changed
  for gid in $(seq 64000 64999); do getent group "$gid" >/dev/null || break; done
fi
uid=$(id -u nobody) ugid=$(id -g nobody)
bench_dataset ram "$PWD/.bench/node"
w=$bench_work
bin/mkbmap inspect --format json -o "$w/train.json" "$w/train.bmap" >/dev/null
nraw=$($py bench/iolog_shuffled.py --map-json "$w/train.json" --out "$w/shuffled.iolog" --seed 1 --epochs 3)
bench_serve "$w/d.sock" "$w/loaderd.log" --socket-group "$gid" --socket-mode 0660 --dataset "train=$w/train.bmap"
d=$bench_daemon
# nobody cannot run the venv's interpreter when it lives under root's
# home: the system's, with the venv's packages (as python/tests/asuser.py).
site=$($py -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
pyv=$($py -c 'import sys; print(f"python{sys.version_info.major}.{sys.version_info.minor}")')
asuser=(setpriv --reuid="$uid" --regid="$ugid" --groups="$gid" env "PYTHONPATH=$PWD/python:$site" HOME=/tmp "/usr/bin/$pyv")
out=$PWD/.bench/node.jsonl
: > "$out"
tag() { $py -c 'import json,sys; r=json.loads(sys.stdin.read()); r.update(case=sys.argv[1], round=int(sys.argv[2])); print(json.dumps(r))' "$1" "$2" >> "$out"; }
ranks() { "${asuser[@]}" bench/sessions.py --socket "$w/d.sock" --backend "" --sessions 8 --epochs 3 --open-first --daemon-pid "$d" --batch-size "$1"; }
huge=${HUGEPAGES:-1024} pages0=$(cat /proc/sys/vm/nr_hugepages)
trap 'echo "$pages0" > /proc/sys/vm/nr_hugepages; bench_cleanup' EXIT
huge_ranks() {
  local before after
  before=$(grep -c "batch memory on huge pages" "$w/loaderd.log" || true)
  echo "$huge" > /proc/sys/vm/nr_hugepages
  $py - <<'WARM'
import mmap, os
free = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("HugePages_Free:"))
fd = os.memfd_create("warm", os.MFD_HUGETLB)
os.ftruncate(fd, free << 21)
m = mmap.mmap(fd, free << 21)
for off in range(0, free << 21, 1 << 21):
    m[off] = 1
m.close()
os.close(fd)
WARM
  ranks "$1"
  echo "$pages0" > /proc/sys/vm/nr_hugepages
  after=$(grep -c "batch memory on huge pages" "$w/loaderd.log" || true)
  if (( after - before != 8 )); then
    echo "node: $((after - before)) of 8 sessions had huge pages ($huge reserved: HUGEPAGES)" >&2; return 1
  fi
}
fio() { $py bench/fio_replay.py --iolog "$w/shuffled.iolog" --samples $((3 * nraw)) --iodepth $((8 * qd)) "$@"; }
cases=("8 ranks b64|ranks 64" "fio qd$((8 * qd))|fio" "fio qd$((8 * qd))+fixedbufs|fio --fixedbufs" "8 ranks b16|ranks 16" "8 ranks b64 huge pages|huge_ranks 64")
for r in $(seq 1 "$rounds"); do
  order=("${cases[@]}")
  if (( r % 2 == 0 )); then order=(); for ((i = ${#cases[@]} - 1; i >= 0; i--)); do order+=("${cases[i]}"); done; fi
  for c in "${order[@]}"; do
    IFS='|' read -r label cmd <<<"$c"
    drop
    # shellcheck disable=SC2086 # cmd is the case's function and flags
    $cmd | tag "$label" "$r"
  done
  echo "node: round $r of $rounds done" >&2
done
$py - "$out" "$nraw" "$qd" <<'PY'
import json, sys
sys.path.insert(0, "bench")
from rounds import by_round, figure, goal_line, ratio
rows = [json.loads(l) for l in open(sys.argv[1])]
nraw, qd = int(sys.argv[2]), int(sys.argv[3])
by = {}
for r in rows:
    by.setdefault(r["case"], []).append(r)
fio = [c for c in by if c.startswith("fio ")]
best = {n: max(by_round(by[c], "samples_per_s")[n] for c in fio) for n in by_round(by[fio[0]], "samples_per_s")}
top = {n: max((r for c in fio for r in by[c] if r["round"] == n), key=lambda r: r["samples_per_s"]) for n in best}
fio_us = {n: r["cpu_seconds"] / r["samples"] * 1e6 for n, r in top.items()}  # the best setting's own CPU
b64, b16, hp = by["8 ranks b64"], by["8 ranks b16"], by["8 ranks b64 huge pages"]
print(f"\nram device, {nraw} files, 8 ranks as nobody in the socket group ({b64[0]['backend']}), opened, then from a barrier "
      f"3 shuffled epochs each, cold; fio: the same bytes at queue depth {8 * qd}; medians of {len(b64)} rounds [min-max]")
print(f"{'case':<28}{'samples/s':>26}  {'CPU us/sample: daemon':>24}  {'clients':>22}  {'total':>22}")
for c in by:
    s = figure(r["samples_per_s"] for r in by[c])
    if c.startswith("fio "):
        cpu = figure(r["cpu_seconds"] / r["samples"] * 1e6 for r in by[c])
        print(f"{c:<28}{s.text(0):>26}  {'':>24}  {'':>22}  {cpu.text(1):>22}")
        continue
    dn, cl = figure(r["daemon_us"] for r in by[c]), figure(r["clients_us"] for r in by[c])
    tot = figure(r["daemon_us"] + r["clients_us"] for r in by[c])
    print(f"{c:<28}{s.text(0):>26}  {dn.text(1):>24}  {cl.text(1):>22}  {tot.text(1):>22}")
f16 = figure((r["daemon_us_per_batch"] + r["clients_us_per_batch"]) / 1e3 for r in b16)
print(f"batch 16, CPU per batch, daemon + clients: {f16.text(3)} ms over {f16.rounds} rounds "
      f"(daemon {figure(r['daemon_us_per_batch'] / 1e3 for r in b16).text(3)}, "
      f"clients {figure(r['clients_us_per_batch'] / 1e3 for r in b16).text(3)})")
for c in ("8 ranks b64", "8 ranks b64 huge pages"):
    aft = by_round(by[c], "after_first_epoch_samples_per_s")
    cpu = figure(r["after_first_epoch_daemon_us"] + r["after_first_epoch_clients_us"] for r in by[c])
    print(f"{c}, after the first epoch: {figure(aft.values()).text(0)} samples/s, "
          f"{ratio(aft, best).text(2)}x fio best, CPU {cpu.text(1)} us a sample (daemon + clients)")
fb = figure(best.values())
print(f"fio best (the better setting each round): {fb.text(0)} samples/s over {fb.rounds} rounds; "
      f"fio's own CPU per sample: {figure(fio_us.values()).text(1)} us over {len(fio_us)} rounds")
print(goal_line("node: 8 ranks, batch 64, vs fio best", ratio(by_round(b64, "samples_per_s"), best), "x", ">=", 0.9))
print(goal_line("node: CPU per sample, daemon + clients, batch 64", figure(r["daemon_us"] + r["clients_us"] for r in b64),
                " us", "<=", 10, 1))
print(goal_line("node: 8 ranks, batch 64, huge pages, vs fio best", ratio(by_round(hp, "samples_per_s"), best), "x", ">=", 0.9))
print(goal_line("node: CPU per sample, daemon + clients, batch 64, huge pages",
                figure(r["daemon_us"] + r["clients_us"] for r in hp), " us", "<=", 10, 1))
PY
