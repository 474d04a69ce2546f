#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU path on a GPU machine, in one command; with --standin, the same
# script against the CUDA stand-in on any machine.
#
#   bench/gpu.sh [--standin] [--no-loop] [FILES]      (or STANDIN=1, NOLOOP=1)
#   env: TENSOR_SIZES="256k 16m", TENSOR_MB=2048, TENSOR_ROUNDS=3 (step 7;
#        TENSOR_SIZES="" skips it)
#
# BUILD HERE (any Linux machine with Go; the binaries need only glibc's
# libc, so they run whatever the GPU machine's glibc is):
#   CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath \
#     -ldflags "-X main.version=$(cat python/nvfeed/VERSION)" -o bin/ ./cmd/... ./tools/...
# (`make build` uses cgo: it adds `loaderd check`'s NVML probe and needs
# the GPU machine's glibc to be at least this machine's.)
# COPY, keeping the paths (nothing else is needed; no Go there):
#   tar czf nvfeed-gpu.tgz bin/loaderd bin/mkbmap bin/gendataset \
#     bench/gpu.sh bench/gpu_check.py python/nvfeed \
#     bench/npy_dataset.py bench/tensor_read.py bench/tensor_compare.py
# (the last three: step 7, the tensor run; it is skipped, saying so,
# without them, or with a loaderd that does not serve tensor maps)
# Instead of bin/loaderd, bin/mkbmap and python/nvfeed, the wheel from
# `make wheel` (dist/nvfeed-*.whl) may be pip-installed into the GPU
# machine's PyTorch environment: loaderd and mkbmap are then taken from
# that environment's bin (bin/gendataset is still needed). For --standin
# add internal/cuda/standin/csrc/ (its C sources and build.sh; needs cc).
# RUN THERE, as root, with the Python environment that has PyTorch (or
# CuPy) and NVIDIA's CUDA wheels (and DALI, nvidia-dali-cuda*, for step
# 7's reference; without it torch is the reference):
#   tar xzf nvfeed-gpu.tgz && PYTHON=/path/to/env/bin/python bash bench/gpu.sh
#
# Without an NVIDIA driver (/proc/driver/nvidia/version missing) it says
# "no GPU" and exits 0, whatever the environment names (the stand-in is
# used only when asked with --standin). With a driver:
#  1. CUDA libraries: computes the NVIDIA wheels' lib directories of
#     $PYTHON's environment (nvidia/*/lib, torch/lib) and CUDA_HOME, prints
#     which of libcudart, libcufile and libcuda each holds and what the
#     loader's cache has, and passes the one with libcudart.so.13 (else
#     .so.12) to loaderd as NVFEED_CUDA_LIB_DIR and --cuda-lib-dir (where
#     loaderd has the flag); to the client only where that directory
#     holds libcuda.so.1 (the client loads libcuda from it, else from the
#     dynamic loader: the driver's). NVFEED_CUDA_LIB_DIR already set
#     wins. It refuses a directory that holds the stand-in.
#  2. The data: an ext4 loop device when losetup and /dev/loop-control
#     work (needs root), else a plain directory on this machine's own
#     filesystem, which serves `file` and `cufile` only (gds and bam read
#     raw block extents: a directory whose device this container cannot
#     open, or a map without extents, gives them nothing to read). Two
#     datasets: `train` (ImageNet-shaped, sizes vary) and `tensors`
#     (every sample 150528 bytes, 224x224x3: dense batches).
#  3. `loaderd check`.
#  4. Exactness: bounce x file, gds, bam and cufile, then the dense
#     `tensors` set (batch_format="dali": one (batch, size) array per
#     batch), then gpu_path auto (expected: cufile when cuFile's own
#     statistics say gds, bounce when they say compat): two epochs, two
#     shards, shuffled; every sample's bytes and label against the files,
#     zero copy (the consumer's pointer is the sample's address in the
#     imported allocation), the memory's GPU UUID against the client's,
#     and the release rule: the consumer queues slow GPU work and a copy
#     of each sample to the host on its own stream and waits for them only
#     at the end of an epoch, so a slot handed back before that work ran
#     gives wrong bytes (shard 0 releases with the client's default,
#     shard 1 with cuda_stream set to the consumer's stream and takes its
#     batches as DALI's two sources do: src.labels, src.samples). With two
#     or more GPUs and no CUDA_VISIBLE_DEVICES, the daemon sees them in
#     reverse order (1,0) and the client as 0,1: only UUIDs match them.
#  5. cuFile's mode from its own statistics (loaderd bench --backend
#     cufile --memory gpu).
#  6. Speed, bytes only: samples/s into GPU memory (cufile; bounce) against
#     host batches and a PyTorch read + .cuda() baseline, cold where
#     drop_caches may be written.
#  7. Tensors into GPU memory: .npy datasets made by np.save (float32,
#     256 KiB and 16 MiB tensors, TENSOR_MB each, on the same loop device
#     or directory), mapped with mkbmap --reader numpy; tensors/s and GB/s
#     of loaderd bench --memory gpu (gpu_path cufile: --backend cufile;
#     bounce: the gds backend, file without a loop device) and --memory
#     pinned, against fn.readers.numpy(device="gpu") where DALI imports
#     and torch.from_numpy(np.load(f)).cuda() where PyTorch has CUDA;
#     shuffled, cold, medians of TENSOR_ROUNDS (bench/tensor_compare.py).
#     Skipped, with the reason, where a piece is missing: the three
#     scripts, numpy, a loaderd that serves tensor maps; a reference that
#     fails is shown as skipped with its error.
# --standin builds the stand-in (internal/cuda/standin/csrc/build.sh),
# runs 2-5 against it (CUDA_STANDIN_GPUS=2; the daemon sees 1,0), again
# with CUFILE_STANDIN_MODE=compat (auto must pick bounce), skips 6 (the
# stand-in's timings say nothing), runs 7 once on 64 MiB as a dry run of
# its steps (no figures worth reading; the references need a real GPU
# and skip), and checks every process's stand-in
# report (CUDA_STANDIN_REPORT): no violation, nothing left allocated,
# mapped or registered, no spinning event. --no-loop takes the directory
# even where loop devices work. Exits 1 when any check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
STANDIN=${STANDIN:-0} NOLOOP=${NOLOOP:-0} FILES=''
TENSOR_SIZES=${TENSOR_SIZES-256k 16m} TENSOR_MB=${TENSOR_MB:-2048} TENSOR_ROUNDS=${TENSOR_ROUNDS:-3}
while (($#)); do
  case $1 in
    --standin) STANDIN=1 ;;
    --no-loop) NOLOOP=1 ;;
    -h|--help) sed -n '3,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu: unknown flag $1 (usage: bench/gpu.sh [--standin] [--no-loop] [FILES])" >&2; exit 2 ;;
    *) FILES=$1 ;;
  esac
  shift
done
if [[ $STANDIN != 1 && ! -e /proc/driver/nvidia/version ]]; then
  echo "gpu: no GPU (no NVIDIA driver here: /proc/driver/nvidia/version is missing): nothing to run"
  echo "gpu: bash bench/gpu.sh --standin runs the same checks against the CUDA stand-in"
  exit 0
fi

if [[ $STANDIN == 1 ]]; then
  FILES=${FILES:-256}
  TENSOR_MB=64 TENSOR_ROUNDS=1
  PY=${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}
else
  FILES=${FILES:-2000}
  PY=${PYTHON:-python3}
fi
command -v "$PY" >/dev/null || { echo "gpu: no Python at $PY: set PYTHON to the environment's python" >&2; exit 1; }
PY=$(command -v "$PY")
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
# loaderd and mkbmap from bin/, else from the Python environment (the wheel).
tool() {
  if [[ -x bin/$1 ]]; then echo "$PWD/bin/$1"
  elif [[ -x $(dirname "$PY")/$1 ]]; then echo "$(dirname "$PY")/$1"
  else echo "gpu: $1 missing: build bin/ where Go is (this script's header says how) and carry it" >&2; return 1
  fi
}
LOADERD=$(tool loaderd)
MKBMAP=$(tool mkbmap)
[[ -x bin/gendataset ]] || { echo "gpu: bin/gendataset missing: build bin/ where Go is and carry it" >&2; exit 1; }
echo "== python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
"$PY" - <<'EOF' || true
for m in ("torch", "cupy", "nvidia.dali"):
    try:
        mod = __import__(m, fromlist=["_"])
        cuda = getattr(getattr(mod, "version", None), "cuda", None)
        print(f"   {m} {getattr(mod, '__version__', '?')}" + (f" (CUDA {cuda})" if cuda else ""))
    except Exception as e:
        print(f"   {m}: not importable ({type(e).__name__})")
EOF

WORK=${WORK:-$PWD/.bench/gpu}
mkdir -p "$WORK"
STANDIN_MARK='cuStandinLaunchRead'   # the stand-in's test hook: in its libcuda, never in NVIDIA's
CONSUMER=auto
if [[ $STANDIN == 1 ]]; then
  [[ -f internal/cuda/standin/csrc/build.sh ]] || {
    echo "gpu: --standin needs internal/cuda/standin/csrc/build.sh (the CUDA stand-in); this tree lacks it" >&2; exit 1; }
  echo "== the CUDA stand-in (internal/cuda/standin/csrc/build.sh)"
  LIBDIR=$(bash internal/cuda/standin/csrc/build.sh "$WORK/standin" | tail -1)
  for l in libcudart.so.13 libcuda.so.1 libcufile.so.0; do
    [[ -e $LIBDIR/$l ]] || { echo "gpu: the stand-in build made no $LIBDIR/$l" >&2; exit 1; }
  done
  REPORT=$WORK/standin-report
  rm -rf "$REPORT" && mkdir -p "$REPORT"
  export CUDA_STANDIN_REPORT=$REPORT CUDA_STANDIN_GPUS=2
  unset CUFILE_STANDIN_MODE CUFILE_STANDIN_FAIL CUDA_STANDIN_RDMA CUDA_VISIBLE_DEVICES
  CONSUMER=standin
  echo "   $LIBDIR: libcudart.so.13, libcuda.so.1, libcufile.so.0 (stand-ins over host memory; 2 GPUs)"
else
  echo "== CUDA libraries (discovery: explicit directory, the wheels of $PY's environment, CUDA_HOME, the loader's cache)"
  unset CUDA_STANDIN_REPORT CUFILE_STANDIN_MODE CUFILE_STANDIN_FAIL
  cands=() tags=()
  # The NVIDIA wheels' lib directories of $PY's environment (and torch's own).
  wheels_py='
import glob, os
out = []
try:
    import nvidia
    for p in list(getattr(nvidia, "__path__", [])):
        out += sorted(glob.glob(os.path.join(p, "*", "lib")))
except Exception:
    pass
try:
    import torch
    out.append(os.path.join(os.path.dirname(torch.__file__), "lib"))
except Exception:
    pass
print("\n".join(out))
'
  while IFS= read -r dir; do
    [[ -n $dir ]] && cands+=("$dir") tags+=(wheel)
  done < <("$PY" -c "$wheels_py" 2>/dev/null || true)
  if [[ -n ${CUDA_HOME:-} ]]; then
    for dir in "$CUDA_HOME/lib64" "$CUDA_HOME/lib"; do cands+=("$dir") tags+=(CUDA_HOME); done
  else
    echo "   CUDA_HOME is not set"
  fi
  LIBDIR=${NVFEED_CUDA_LIB_DIR:-}
  [[ -n $LIBDIR ]] && echo "   NVFEED_CUDA_LIB_DIR=$LIBDIR (given: it wins)"
  for13='' for12='' cufile_at=''
  for i in "${!cands[@]}"; do
    dir=${cands[$i]} has=()
    for l in libcudart.so.13 libcudart.so.12 libcufile.so.0 libcuda.so.1; do
      [[ -e $dir/$l ]] && has+=("$l")
    done
    ((${#has[@]})) || continue
    echo "   ${tags[$i]}: $dir: ${has[*]}"
    [[ -z $for13 && -e $dir/libcudart.so.13 ]] && for13=$dir
    [[ -z $for12 && -e $dir/libcudart.so.12 ]] && for12=$dir
    [[ -z $cufile_at && -e $dir/libcufile.so.0 ]] && cufile_at=$dir
  done
  if command -v ldconfig >/dev/null; then
    ldconfig -p 2>/dev/null | grep -E 'lib(cudart|cufile|cuda)\.so' | sed 's/^\s*/   loader cache: /' || echo "   loader cache: no libcudart, libcufile or libcuda"
  fi
  LIBDIR=${LIBDIR:-${for13:-$for12}}
  if [[ -z $LIBDIR ]]; then
    echo "   no directory with libcudart found: the daemon's own discovery decides (see loaderd check)"
  else
    if [[ ! -e $LIBDIR/libcufile.so.0 ]]; then
      echo "   libcufile.so.0 is not in $LIBDIR: the daemon's own discovery must find it${cufile_at:+ (it is in $cufile_at)}"
    fi
  fi
fi
if [[ -n ${LIBDIR:-} ]]; then
  if [[ $STANDIN != 1 ]] && grep -qs "$STANDIN_MARK" "$LIBDIR"/libcuda.so.1 "$LIBDIR"/libcudart.so.13 "$LIBDIR"/libcufile.so.0; then
    echo "gpu: $LIBDIR holds the CUDA stand-in, not NVIDIA's libraries: unset NVFEED_CUDA_LIB_DIR, or run with --standin" >&2
    exit 1
  fi
fi
# loaderd gets LIBDIR; a client, only where LIBDIR has libcuda.so.1 (it
# would look for it there and nowhere else).
unset NVFEED_CUDA_LIB_DIR
LENV=() CLIB=()
if [[ -n ${LIBDIR:-} ]]; then
  LENV=("NVFEED_CUDA_LIB_DIR=$LIBDIR")
  echo "   passing NVFEED_CUDA_LIB_DIR=$LIBDIR to loaderd"
  if [[ -e $LIBDIR/libcuda.so.1 ]]; then
    CLIB=("NVFEED_CUDA_LIB_DIR=$LIBDIR")
    echo "   and to the clients (it holds libcuda.so.1)"
  else
    echo "   the clients load libcuda.so.1 (the driver's) through the dynamic loader"
  fi
fi
# --cuda-lib-dir for a loaderd command, where that command has the flag.
lib_flag() {
  local help
  help=$("$LOADERD" "$1" --help 2>&1 || true)
  [[ -n ${LIBDIR:-} && $help == *-cuda-lib-dir* ]] && printf '%s\n' "--cuda-lib-dir=$LIBDIR"
  return 0
}
mapfile -t SERVE_LIB < <(lib_flag serve)
mapfile -t CHECK_LIB < <(lib_flag check)
mapfile -t BENCH_LIB < <(lib_flag bench)
[[ -n ${LIBDIR:-} && ${#SERVE_LIB[@]} == 0 ]] && echo "   (this loaderd has no --cuda-lib-dir: it reads NVFEED_CUDA_LIB_DIR only)"

echo "== loaderd check"
bin_check=$(env "${LENV[@]}" "$LOADERD" check "${CHECK_LIB[@]}" --json 2>/dev/null) || true
env "${LENV[@]}" "$LOADERD" check "${CHECK_LIB[@]}" || true
if ! "$PY" -c 'import json, sys; r = json.loads(sys.argv[1]); sys.exit(0 if r.get("nvidia_driver", {}).get("ok") and r.get("cuda_runtime", {}).get("ok") else 1)' "$bin_check" 2>/dev/null; then
  echo "gpu: FAILED: $([[ $STANDIN == 1 ]] && echo "the stand-in is loaded" || echo "an NVIDIA driver is loaded"), but loaderd check finds no usable driver and CUDA runtime (above)" >&2
  exit 1
fi

# GPU order: with two GPUs or more, the daemon sees them reversed.
DENV=() CENV=() DAEMON_DEV=()
ngpu=$("$PY" -c 'import json, sys; print(len(json.loads(sys.argv[1]).get("cuda_devices") or []))' "$bin_check" 2>/dev/null || echo 0)
if ((ngpu == 0)) && [[ $STANDIN != 1 ]] && command -v nvidia-smi >/dev/null; then
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
if ((ngpu >= 2)) && [[ -z ${CUDA_VISIBLE_DEVICES:-} ]]; then
  DENV=("CUDA_VISIBLE_DEVICES=1,0") CENV=("CUDA_VISIBLE_DEVICES=0,1") DAEMON_DEV=(--daemon-device 1)
  echo "== GPU order: the daemon sees 1,0, the clients 0,1 (the client's GPU 0 is the daemon's GPU 1: only UUIDs match them)"
fi

# The data: an ext4 loop device, else a directory.
why=
if [[ $NOLOOP == 1 ]]; then why="--no-loop"
elif [[ $(id -u) != 0 ]]; then why="not root"
elif ! command -v losetup >/dev/null || ! command -v mkfs.ext4 >/dev/null; then why="no losetup or mkfs.ext4"
elif [[ ! -e /dev/loop-control ]]; then why="no /dev/loop-control"
elif ! losetup --find >/dev/null 2>&1; then why="losetup --find finds no free loop device"
fi
TFILES=$((FILES / 2 > 128 ? FILES / 2 : 128))  # 150528 bytes each; 8 batches of 8 a shard at least
d='' loop=''
# shellcheck disable=SC2317 # called by the trap
cleanup() {
  if [[ -n $d ]]; then kill -TERM "$d" 2>/dev/null || true; wait "$d" 2>/dev/null || true; fi
  if [[ -n $loop ]]; then
    umount "$WORK/mnt" 2>/dev/null || true
    losetup -d "$loop" 2>/dev/null || true
    rm -f "$WORK/img"
  fi
}
trap cleanup EXIT
if [[ -z $why ]]; then
  echo "== data: an ext4 loop device, O_DIRECT ($FILES + $TFILES files)"
  mountpoint -q "$WORK/mnt" 2>/dev/null && umount "$WORK/mnt"
  rm -f "$WORK/img"
  truncate -s "$((4096 + $(wc -w <<<"$TENSOR_SIZES") * TENSOR_MB * 115 / 100))M" "$WORK/img"
  mkfs.ext4 -q -F -b 4096 "$WORK/img"
  loop=$(losetup --find --show --direct-io=on "$WORK/img")
  mkdir -p "$WORK/mnt" && mount "$loop" "$WORK/mnt"
  data=$WORK/mnt
  BOUNCE=(file gds bam) RAWB=gds
else
  echo "== data: a plain directory on this machine's filesystem ($why): file and cufile only;"
  echo "   gds and bam skipped: they read raw block extents, which need the block device this script makes"
  data=$WORK/dir
  rm -rf "$data" && mkdir -p "$data"
  BOUNCE=(file) RAWB=file
fi
bin/gendataset --out "$data/train" --files "$FILES" --classes 100 --mean 110000 >/dev/null
bin/gendataset --out "$data/tensors" --files "$TFILES" --classes 10 --mean 150528 --sigma 0 >/dev/null
sync
for set in train tensors; do
  "$MKBMAP" --mountpoint "$data/$set" -o "$WORK/$set.bmap" 2>&1 | sed "s/^/   mkbmap $set: /"
done
sock=$WORK/d.sock
log=$WORK/loaderd.log
: >"$log"
start_daemon() {
  rm -f "$sock"
  env "${LENV[@]}" "${DENV[@]}" "$LOADERD" serve "${SERVE_LIB[@]}" --socket "$sock" \
    --dataset "train=$WORK/train.bmap" --dataset "tensors=$WORK/tensors.bmap" 2>>"$log" & d=$!
  local i
  for ((i = 0; i < 1500; i++)); do
    [[ -S $sock ]] && return 0
    kill -0 "$d" 2>/dev/null || break
    sleep 0.02
  done
  echo "gpu: loaderd did not start:" >&2; tail -20 "$log" >&2; exit 1
}
stop_daemon() { kill -TERM "$d"; wait "$d" || true; d=; }
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || echo "   (page cache not dropped: drop_caches is not writable here)"; }
status=0
check() { env "${CLIB[@]}" "${CENV[@]}" "$PY" bench/gpu_check.py exact --socket "$sock" --consumer "$CONSUMER" "${DAEMON_DEV[@]}" "$@" || status=1; }
# cuFile's mode from its own statistics; prints it, sets MODE.
cufile_mode() {
  local out
  drop_caches
  out=$(env "${LENV[@]}" "$LOADERD" bench "${BENCH_LIB[@]}" --bmap "$WORK/train.bmap" --backend cufile --memory gpu --shuffle 2>&1) || status=1
  printf '%s\n' "$out" | sed 's/^/   /'
  MODE=$(printf '%s\n' "$out" | grep -o 'cufile_mode=[a-z]*' | tail -1 | cut -d= -f2 || true)
  echo "   cuFile ran in mode: ${MODE:-unknown}"
  [[ -n $MODE ]] || status=1
}
# All exactness runs against the running daemon; $1 names the cuFile mode
# the daemon's cuFile runs in (gds: auto must pick cufile; compat: bounce).
exactness() {
  local b expect
  echo "== bytes, labels, zero copy, UUID and release: bounce x ${BOUNCE[*]}, and cufile; 2 epochs, 2 shards, shuffled"
  for b in "${BOUNCE[@]}"; do
    check --dataset train --root "$data/train" --backend "$b" --gpu-path bounce
  done
  check --dataset train --root "$data/train" --backend cufile --gpu-path cufile
  echo "== dense batches (tensors: every sample 150528 bytes; batch_format=dali: one (batch, size) array)"
  check --dataset tensors --root "$data/tensors" --backend "$RAWB" --gpu-path bounce --dense
  check --dataset tensors --root "$data/tensors" --backend cufile --gpu-path cufile --dense
  echo "== cuFile's mode, from its own statistics (one cold epoch, loaderd bench)"
  cufile_mode
  case ${MODE:-} in gds) expect=cufile ;; compat) expect=bounce ;; *) expect= ;; esac
  echo "== gpu_path auto (cuFile in ${MODE:-an unknown} mode: expected ${expect:-either})"
  check --dataset train --root "$data/train" --gpu-path auto ${expect:+--expect-path "$expect"}
}

# Step 7: tensors into GPU memory. Appends to status only for loaderd's
# own failures; a missing piece skips, saying which.
tensor_speed() {
  local why='' f size shape batch tbytes n root map err c name cmd out b0 b1 r
  local res=$WORK/tensors.jsonl
  echo "== tensors into GPU memory: loaderd bench --memory gpu (cufile; $RAWB bounce) vs fn.readers.numpy(device=\"gpu\"), torch (cold)"
  for f in bench/npy_dataset.py bench/tensor_read.py bench/tensor_compare.py; do
    [[ -f $f ]] || why="$f is missing (copy it: this script's header says what)"
  done
  [[ -z $why ]] && ! "$PY" -c 'import numpy' 2>/dev/null && why="numpy does not import in $PY"
  [[ -z $TENSOR_SIZES ]] && why="TENSOR_SIZES is empty"
  if [[ -n $why ]]; then echo "   skipped: $why"; return 0; fi
  local dali_why='' torch_why=''
  "$PY" -c 'import nvidia.dali' 2>/dev/null || dali_why="DALI does not import in $PY (pip install nvidia-dali-cuda130 for this reference)"
  env "${CLIB[@]}" "${CENV[@]}" "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
    torch_why="PyTorch with CUDA does not import in $PY, or sees no GPU"
  # A loop device: its sysfs stat says what the device read.
  devread() {
    local s
    if [[ -n $loop ]]; then read -r _ _ s _ <"/sys/block/$(basename "$loop")/stat"; echo $((s * 512)); else echo -1; fi
  }
  skip_case() { "$PY" bench/tensor_compare.py skip --case "$1" --device "$2" --size "$3" --why "$4" >>"$res"; }
  local where=dir
  [[ -n $loop ]] && where=loop
  [[ -w /proc/sys/vm/drop_caches ]] || echo "   (drop_caches is not writable here: warm figures)"
  : >"$res"
  for size in $TENSOR_SIZES; do
    case $size in
      256k) shape=256,256 batch=64 tbytes=262144 ;;
      16m) shape=2048,2048 batch=8 tbytes=16777216 ;;
      *) echo "   FAILED: TENSOR_SIZES: unknown size $size (256k or 16m)"; status=1; continue ;;
    esac
    n=$((TENSOR_MB * 1048576 / tbytes / batch * batch))
    ((n > 0)) || n=$batch
    root=$data/npy-$size map=$WORK/npy-$size.bmap
    rm -rf "$root"
    echo "   $size: $n files of float32 ($shape) in $root"
    "$PY" bench/npy_dataset.py --out "$root" --files "$n" --shape "$shape" >/dev/null
    sync
    "$MKBMAP" --reader numpy --mountpoint "$root" -o "$map" 2>&1 | sed "s/^/   mkbmap npy-$size: /"
    if ! err=$(env "${LENV[@]}" "${CENV[@]}" "$LOADERD" bench "${BENCH_LIB[@]}" --bmap "$map" --batch-size "$batch" \
      --batches 1 --json 2>&1 >/dev/null); then
      if [[ $err == *"not served"* ]]; then
        echo "   skipped: this loaderd refuses tensor maps (it predates tensor serving): build bin/ from a tree that serves them"
        rm -rf "$root"
        return 0
      fi
      echo "   FAILED: loaderd bench on $map: $(tail -1 <<<"$err")"
      status=1
      rm -rf "$root"
      continue
    fi
    local ld="env ${LENV[*]} ${CENV[*]} $LOADERD bench ${BENCH_LIB[*]} --bmap $map --batch-size $batch --shuffle --seed @R --json"
    local cases=("loaderd gpu cufile|$ld --memory gpu --backend cufile"
                 "loaderd gpu $RAWB bounce|$ld --memory gpu --backend $RAWB"
                 "loaderd pinned $RAWB|$ld --memory pinned --backend $RAWB")
    local refenv="env ${CLIB[*]} ${CENV[*]} $PY bench/tensor_read.py"
    if [[ -z $dali_why ]]; then
      cases+=("dali readers.numpy gpu|$refenv dali --device gpu --root $root --batch-size $batch --seed @R")
    else
      skip_case "dali readers.numpy gpu" "$where" "$size" "$dali_why"
    fi
    if [[ -z $torch_why ]]; then
      cases+=("torch np.load .cuda()|$refenv torch-cuda --root $root --seed @R")
    else
      skip_case "torch np.load .cuda()" "$where" "$size" "$torch_why"
    fi
    local failed=()
    for ((r = 1; r <= TENSOR_ROUNDS; r++)); do
      local order=("${cases[@]}")
      if ((r % 2 == 0)); then order=(); for ((i = ${#cases[@]} - 1; i >= 0; i--)); do order+=("${cases[i]}"); done; fi
      for c in "${order[@]}"; do
        name=${c%%|*} cmd=${c#*|}
        [[ " ${failed[*]} " == *" $name "* ]] && continue
        drop_caches >/dev/null 2>&1
        b0=$(devread)
        # shellcheck disable=SC2086 # cmd is a command line of plain words
        if ! out=$(${cmd//@R/$r} 2>"$WORK/tensor-case.err"); then
          failed+=("$name")
          echo "   $name failed: $(tail -1 "$WORK/tensor-case.err")"
          if [[ $name == loaderd* ]]; then status=1; fi
          skip_case "$name" "$where" "$size" "failed: $(tail -1 "$WORK/tensor-case.err")"
          continue
        fi
        b1=$(devread)
        printf '%s\n' "$out" | "$PY" bench/tensor_compare.py tag --case "$name" --round "$r" --device "$where" \
          --size "$size" --dev-bytes $((b0 < 0 ? -1 : b1 - b0)) --tensor-bytes "$tbytes" --shape "$shape" \
          --batch "$batch" --files "$n" >>"$res"
      done
    done
    rm -rf "$root"
  done
  "$PY" bench/tensor_compare.py summary --gpu <"$res" | sed 's/^/   /'
}

start_daemon
if [[ $STANDIN == 1 ]]; then
  echo "#### stand-in, cuFile in GDS mode (CUFILE_STANDIN_MODE=gds)"
  export CUFILE_STANDIN_MODE=gds
  exactness
  [[ ${MODE:-} == gds ]] || { echo "gpu: FAILED: the stand-in's cuFile ran in GDS mode, loaderd bench read ${MODE:-nothing}"; status=1; }
  stop_daemon
  echo "#### stand-in, cuFile in compatibility mode (CUFILE_STANDIN_MODE=compat)"
  export CUFILE_STANDIN_MODE=compat
  start_daemon
  exactness
  [[ ${MODE:-} == compat ]] || { echo "gpu: FAILED: the stand-in's cuFile ran in compat mode, loaderd bench read ${MODE:-nothing}"; status=1; }
  stop_daemon
  echo "== speed: skipped (the stand-in's timings say nothing about a GPU)"
  echo "== step 7 against the stand-in: a dry run of the tensor run's steps (its figures say nothing)"
  tensor_speed
  echo "== the stand-in's reports (every process: violations, what was left live at exit)"
  "$PY" bench/gpu_check.py report --dir "$REPORT" || status=1
else
  exactness
  echo "== samples/s into GPU memory, bytes only (drop_caches before each)"
  env "${CLIB[@]}" "${CENV[@]}" "$PY" bench/gpu_check.py speed --socket "$sock" --root "$data/train" --bounce-backend "$RAWB" || status=1
  stop_daemon
  tensor_speed
fi
echo "== daemon log (tail)"
tail -5 "$log"
echo "gpu: $([[ $status == 0 ]] && echo "every check passed" || echo "FAILURES (above)")$([[ $STANDIN == 1 ]] && echo " (against the CUDA stand-in, not a GPU)")"
exit $status
