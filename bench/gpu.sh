#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU path on a GPU machine, in one command; with --standin, the same
# script against the CUDA stand-in on any machine.
#
#   bench/gpu.sh [--standin] [--no-loop] [FILES]      (or STANDIN=1, NOLOOP=1)
#   env: TENSOR_SIZES="256k 16m", TENSOR_MB=2048, TENSOR_ROUNDS=3 (step 7;
#        TENSOR_SIZES="" skips it); GPU_BUDGET=540 (seconds for the whole
#        run); GPU_LIMITS="PATTERN=SECONDS ..." (a step's own limit, by
#        its name as printed, glob patterns: GPU_LIMITS="exact:*=300";
#        0 skips the step, which fails the run: "speed:*=0");
#        GPU_BIN=bin (where loaderd, mkbmap and gendataset are);
#        GPU_RESULTS (where the logs and figures are copied; $OUT where
#        set, else $WORK/results)
#
# TIME: every step (each command it runs: the stand-in's build, loaderd
# check, the data, every exactness check, each speed row, each tensor
# case) runs under `timeout --kill-after`, its limit cut to what is left
# of GPU_BUDGET; a step that overruns is reported as HUNG with the
# daemon's and cuFile's logs, the daemon is restarted (killed when it
# ignores SIGTERM), and the script goes on; once the budget is spent the
# remaining steps are skipped, saying so. Whatever happens, it ends with
# its figures (speed rows, cuFile's mode, tensor table), where its logs
# were copied, a verdict per GPU path (bounce, cufile, auto: passed,
# FAILED, or "not possible here" with why), and one line: "every check
# passed", "every check this host can run passed; not possible here:
# PATH (why)" or "FAILURES".
#
# NOT POSSIBLE HERE: cuFile's preconditions (a kernel module list,
# /proc/modules; a udev record of the data's device with ID_FS_USAGE)
# are checked before the steps. Where one is unmet the explicit cufile
# steps still run, and their failure is that path's verdict "not
# possible here" with the precondition named, not a failure of the run;
# auto must then take bounce. A cufile step that passes anyway passes;
# one that hangs is a failure (the daemon must refuse, not hang).
# With --standin, STANDIN_CUFILE_HOST=bare gives the stand-in a host
# without either (as a first GPU machine in a container may be).
#
# ON THE DEVICE MACHINE (the project's `run` tool: one command, at most
# 10 minutes, nothing downloaded there). Here, first:
#   CGO_ENABLED=0 go build -trimpath -ldflags "-X main.version=$(cat python/nvfeed/VERSION)" \
#     -o bin/ ./cmd/loaderd ./cmd/mkbmap ./tools/gendataset
# then run with carry ["bin"] (bench/ and python/ are tracked: they go
# along) and timeout_s 600:
#   PYTHONUNBUFFERED=1 GPU_BUDGET=520 TENSOR_MB=1024 bash bench/gpu.sh 2>&1 | tee $OUT/gpu.txt
# (the logs, cufile.log and the figures' JSON land in $OUT too). The
# machine's Python must have PyTorch or CuPy and NVIDIA's CUDA wheels
# (nvidia-cufile, nvidia-cuda-runtime); DALI is optional everywhere.
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
# LIBRARY OWNERSHIP: loaderd loads only libraries whose every path
# component is root's, in folders no one else may write (or sticky). When
# the chosen folder fails that (a pip --user install, a venv in a home
# folder, a group-writable conda tree), the script copies libcudart,
# libcufile (and libcuda.so.1 where the folder has it) into a fresh
# root-owned folder (mktemp -d under /run, else /var/tmp; mode 0755),
# passes that one, and removes it at the end; or prints why it cannot.
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
#     batch; where DALI does not import, batch_format="numpy", whose
#     GPU samples of one size are that same array), then a numpy dataset
#     (`npy`, np.save'd float32 224x224x3, no labels: one dense
#     (batch, 224, 224, 3) array per batch, no DALI anywhere) through
#     bounce and cufile, then gpu_path auto (expected: cufile when cuFile's own
#     statistics say gds, bounce when they say compat): two epochs, two
#     shards, shuffled; every sample's bytes and label against the files,
#     zero copy (the consumer's pointer is the sample's address in the
#     imported allocation), the memory's GPU UUID against the client's,
#     and the release rule: the consumer queues slow GPU work and a copy
#     of each sample to the host and waits for them only at the end of
#     an epoch, so a slot handed back before that work ran gives wrong
#     bytes (shard 0 releases with the client's default, its work where
#     that covers it: PyTorch's current stream, else a blocking stream;
#     shard 1 on a non-blocking stream of its own, passed as cuda_stream,
#     and takes its batches as DALI's two sources do: src.labels,
#     src.samples). With two
#     or more GPUs and no CUDA_VISIBLE_DEVICES, the daemon sees them in
#     reverse order (1,0) and the client as 0,1: only UUIDs match them.
#  5. cuFile's mode from its own statistics (loaderd bench --backend
#     cufile --memory gpu).
#  6. Speed, bytes only: samples/s into GPU memory (cufile; bounce) against
#     host batches and a PyTorch read + .cuda() baseline, cold where
#     drop_caches may be written; each row its own process and step (a
#     row that fails or hangs is shown without figures, the others run).
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
# with CUFILE_STANDIN_MODE=compat (auto must pick bounce), runs 6 once as
# a dry run of its rows (the stand-in's timings say nothing; the baseline
# needs a GPU and shows why it has no figure), runs 7 once on 64 MiB as a
# dry run of its steps (no figures worth reading; the references need a real GPU
# and skip), and checks every process's stand-in
# report (CUDA_STANDIN_REPORT): no violation, nothing left allocated,
# mapped or registered, no spinning event. --no-loop takes the directory
# even where loop devices work. Exits 1 when any check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
STANDIN=${STANDIN:-0} NOLOOP=${NOLOOP:-0} FILES=''
TENSOR_SIZES=${TENSOR_SIZES-256k 16m} TENSOR_MB=${TENSOR_MB:-2048} TENSOR_ROUNDS=${TENSOR_ROUNDS:-3}
BUDGET=${GPU_BUDGET:-540} GPU_LIMITS=${GPU_LIMITS:-} GPU_BIN=${GPU_BIN:-bin}
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
command -v timeout >/dev/null || { echo "gpu: no timeout(1) (coreutils): every step needs a limit" >&2; exit 1; }

# Steps: each command under a limit (`limited`), the whole run under
# BUDGET seconds. Step lines and HUNG reports go to fd 3, the script's
# own stdout, even where a step's output is sent to a file.
exec 3>&1
NSTEPS=0 HUNG=() SKIPPED=()
# Verdicts per GPU path (bounce, cufile, auto): checks passed and failed;
# CUFILE_WHY: cuFile's unmet preconditions ("" when met), NOT_HERE: the
# cufile steps that failed for them.
declare -A PASSED=() FAILED=()
CUFILE_WHY='' NOT_HERE=()
# The limit of step $1: GPU_LIMITS's first pattern it matches, else $2.
limit_of() {
  local kv
  for kv in $GPU_LIMITS; do
    # shellcheck disable=SC2053 # the key is a glob pattern
    [[ $1 == ${kv%=*} ]] && { echo "${kv##*=}"; return 0; }
  done
  echo "$2"
}
# limited NAME SECONDS CMD...: CMD under `timeout --kill-after`, its limit
# cut to what is left of the budget (30 s kept for the end). Returns CMD's
# status; 124 when it overran (reported HUNG, logs shown); 125 when the
# budget was spent and it did not run.
limited() {
  local name=$1 lim left rc=0
  lim=$(limit_of "$1" "$2")
  shift 2
  if ((lim == 0)); then
    echo "   [step $name: SKIPPED: GPU_LIMITS gives it 0s]" >&3
    SKIPPED+=("$name")
    return 125
  fi
  left=$((BUDGET - 30 - SECONDS))
  if ((left < 5)); then
    echo "   [step $name: SKIPPED: the run's ${BUDGET}s budget is spent]" >&3
    SKIPPED+=("$name")
    return 125
  fi
  ((lim > left)) && lim=$left
  NSTEPS=$((NSTEPS + 1))
  echo "   [step $name: limit ${lim}s]" >&3
  timeout --kill-after=5 "$lim" "$@" || rc=$?
  if ((rc == 124 || rc == 137)); then
    echo "gpu: step $name HUNG: not done within its ${lim}s limit, killed; the script goes on" >&3
    HUNG+=("$name")
    show_logs >&3
    return 124
  fi
  return $rc
}

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
# loaderd and mkbmap from GPU_BIN, else from the Python environment (the wheel).
tool() {
  if [[ -x $GPU_BIN/$1 ]]; then realpath "$GPU_BIN/$1"
  elif [[ -x $(dirname "$PY")/$1 ]]; then echo "$(dirname "$PY")/$1"
  else echo "gpu: $1 missing: build $GPU_BIN/ where Go is (this script's header says how) and carry it" >&2; return 1
  fi
}
LOADERD=$(tool loaderd)
MKBMAP=$(tool mkbmap)
[[ -x $GPU_BIN/gendataset ]] || { echo "gpu: $GPU_BIN/gendataset missing: build it where Go is and carry it" >&2; exit 1; }
GENDATA=$(realpath "$GPU_BIN/gendataset")
# The build setting Go records in a binary: CGO_ENABLED=1 needs this
# machine's glibc to be at least the build machine's; CGO_ENABLED=0 (libc
# loaded at run time, by purego) runs on any glibc.
for b in "$LOADERD" "$MKBMAP" "$GENDATA"; do
  cgo=$(LC_ALL=C grep -aom1 'CGO_ENABLED=[01]' "$b" || echo 'CGO_ENABLED=?')
  case $cgo in
    *=0) echo "== $b: built with $cgo" ;;
    *) echo "== $b: built with $cgo: it needs a glibc at least the build machine's (a CGO_ENABLED=0 build does not)" ;;
  esac
done
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
WORK=$(realpath "$WORK")
RESULTS=${GPU_RESULTS:-${OUT:-$WORK/results}}
mkdir -p "$RESULTS"
log=$WORK/loaderd.log
CUFILE_LOG=$WORK/cufile.log
: >"$log"
rm -f "$CUFILE_LOG"
export CUFILE_LOGFILE_PATH=$CUFILE_LOG   # libcufile's log (else cufile.log in the working directory)
SPEED=$WORK/speed.jsonl
rm -f "$SPEED"
MODES=()
show_logs() {
  local f
  for f in "$log" "$CUFILE_LOG"; do
    if [[ -s $f ]]; then echo "   --- $f (tail)"; tail -15 "$f" | sed 's/^/   | /'
    else echo "   --- $f: empty or absent"; fi
  done
}

# Library ownership, as loaderd's discovery judges it (internal/cuda,
# walk.go): why the path $1 would be refused ("" when it would not):
# every component root's (or ours), none in a folder others may write
# unless sticky, the file itself writable by no one else.
path_refusal() {
  local p parent=/ cur comp uid gid mode puid pgid pmode m pm euid
  euid=$(id -u)
  p=$(readlink -f -- "$1") || { echo "$1 does not resolve"; return 0; }
  local -a parts
  IFS=/ read -ra parts <<<"${p#/}"
  for comp in "${parts[@]}"; do
    [[ -n $comp ]] || continue
    cur=${parent%/}/$comp
    read -r uid gid mode < <(stat -c '%u %g %a' -- "$cur") || { echo "$cur: cannot stat"; return 0; }
    read -r puid pgid pmode < <(stat -c '%u %g %a' -- "$parent")
    m=$((8#$mode)) pm=$((8#$pmode))
    if [[ $uid != 0 && $uid != "$euid" ]]; then
      echo "$cur is owned by uid $uid, who could replace the library (root loads it)"; return 0
    fi
    if (((pm & 8#1000) == 0 && ((pm & 8#002) || ((pm & 8#020) && pgid != 0)))); then
      echo "$cur is in $parent (mode $pmode, group $pgid), which others may write and is not sticky"; return 0
    fi
    parent=$cur
  done
  if [[ -f $p ]] && (((m & 8#002) || ((m & 8#020) && gid != 0))); then
    echo "$p is writable by others (mode $mode, group $gid)"
  fi
  return 0
}
# The libraries of folder $1 that loaderd and the clients would load.
libs_in() {
  local l
  for l in libcudart.so.13 libcudart.so.12 libcufile.so.0 libcufile_rdma.so.1 libcuda.so.1; do
    [[ -e $1/$l ]] && echo "$l"
  done
  return 0
}
SAFE_LIBDIR=''
# Where LIBDIR would be refused, a root-owned copy of its libraries
# becomes LIBDIR; else the reason it cannot be.
own_libdir() {
  local why='' l w
  for l in $(libs_in "$LIBDIR"); do
    w=$(path_refusal "$LIBDIR/$l")
    [[ -n $w ]] && { why=$w; break; }
  done
  if [[ -z $why ]]; then echo "   $LIBDIR: root-owned all the way up: loaderd's discovery accepts it"; return 0; fi
  echo "   $LIBDIR would be refused by loaderd's discovery: $why"
  if [[ $(id -u) != 0 ]]; then
    echo "   NOT copied: not root (a root-owned folder needs root); loaderd will refuse these libraries"; return 0
  fi
  SAFE_LIBDIR=$(mktemp -d /run/nvfeed-cuda.XXXXXX 2>/dev/null || mktemp -d /var/tmp/nvfeed-cuda.XXXXXX) || {
    echo "   NOT copied: mktemp -d under /run and /var/tmp failed"; return 0; }
  chown 0:0 "$SAFE_LIBDIR" && chmod 0755 "$SAFE_LIBDIR"
  for l in $(libs_in "$LIBDIR"); do
    cp -L -- "$LIBDIR/$l" "$SAFE_LIBDIR/$l" && chown 0:0 "$SAFE_LIBDIR/$l" && chmod 0644 "$SAFE_LIBDIR/$l"
  done
  w=$(path_refusal "$SAFE_LIBDIR/$(libs_in "$SAFE_LIBDIR" | head -1)")
  if [[ -n $w ]]; then
    echo "   NOT used: the copy in $SAFE_LIBDIR would be refused too: $w"; return 0
  fi
  echo "   copied $(libs_in "$SAFE_LIBDIR" | tr '\n' ' ')to $SAFE_LIBDIR (root's, 0755): passing that instead"
  LIBDIR=$SAFE_LIBDIR
}

STANDIN_MARK='cuStandinLaunchRead'   # the stand-in's test hook: in its libcuda, never in NVIDIA's
CONSUMER=auto
if [[ $STANDIN == 1 ]]; then
  [[ -f internal/cuda/standin/csrc/build.sh ]] || {
    echo "gpu: --standin needs internal/cuda/standin/csrc/build.sh (the CUDA stand-in); this tree lacks it" >&2; exit 1; }
  echo "== the CUDA stand-in (internal/cuda/standin/csrc/build.sh)"
  limited standin-build 300 bash internal/cuda/standin/csrc/build.sh "$WORK/standin" >"$WORK/standin-build.out" 2>&1 || {
    tail -20 "$WORK/standin-build.out" >&2; echo "gpu: the stand-in did not build" >&2; exit 1; }
  LIBDIR=$(tail -1 "$WORK/standin-build.out")
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
  done < <(timeout 60 "$PY" -c "$wheels_py" 2>/dev/null || true)
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
  echo "== library ownership (loaderd loads only root-owned paths)"
  own_libdir
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
  help=$(timeout 20 "$LOADERD" "$1" --help 2>&1 || true)
  [[ -n ${LIBDIR:-} && $help == *-cuda-lib-dir* ]] && printf '%s\n' "--cuda-lib-dir=$LIBDIR"
  return 0
}
mapfile -t SERVE_LIB < <(lib_flag serve)
mapfile -t CHECK_LIB < <(lib_flag check)
mapfile -t BENCH_LIB < <(lib_flag bench)
[[ -n ${LIBDIR:-} && ${#SERVE_LIB[@]} == 0 ]] && echo "   (this loaderd has no --cuda-lib-dir: it reads NVFEED_CUDA_LIB_DIR only)"

d='' loop='' status=0
# One line per GPU path: passed, FAILED (naming the failed checks), or not
# possible here (cufile, its preconditions unmet: naming them).
verdicts() {
  local p
  echo "== verdicts per path"
  for p in bounce cufile auto $(printf '%s\n' "${!FAILED[@]}" "${!PASSED[@]}" | grep -vxE 'bounce|cufile|auto' | sort -u); do
    if [[ -n ${FAILED[$p]:-} ]]; then echo "   $p: FAILED:${FAILED[$p]}"
    elif [[ $p == cufile && ${#NOT_HERE[@]} -gt 0 ]]; then
      echo "   $p: not possible here: $CUFILE_WHY (failed as expected: ${NOT_HERE[*]})${PASSED[$p]:+; passed anyway:${PASSED[$p]}}"
    elif [[ -n ${PASSED[$p]:-} ]]; then echo "   $p: passed:${PASSED[$p]}"
    else echo "   $p: not run"; fi
  done
}
# verdict PATH STEP RC: counts step's outcome (rc) for the path; a cufile
# step failing (not hung) where cuFile's preconditions are unmet is "not
# possible here", not a failure. Returns 1 when the step counts as failed.
verdict() {
  local path=$1 step=$2 rc=$3
  if ((rc == 0)); then PASSED[$path]+=" $step"; return 0; fi
  if [[ $path == cufile && -n $CUFILE_WHY && $rc != 124 ]]; then
    echo "   $step: not possible here: $CUFILE_WHY"
    NOT_HERE+=("$step")
    return 0
  fi
  FAILED[$path]+=" $step"
  return 1
}

# The end, however the script ends: figures, logs collected, then the
# daemon, the loop device and the copied libraries go.
# shellcheck disable=SC2317 # called by the trap
finish() {
  local rc=$? f
  trap - EXIT
  ((rc == 0)) || status=1
  stop_daemon
  echo "== figures"
  echo "   cuFile's mode, from its own statistics: ${MODES[*]:-not measured}"
  if [[ -s $SPEED ]]; then
    echo "   speed (samples/s into GPU memory, bytes only):"
    timeout 60 "$PY" bench/gpu_check.py figures --out "$SPEED" --bounce-backend "${RAWB:-file}" | sed 's/^/ /' || true
  else
    echo "   speed: no row ran"
  fi
  if [[ -s $WORK/tensors.jsonl ]]; then
    echo "   tensors into GPU memory:"
    timeout 60 "$PY" bench/tensor_compare.py summary --gpu <"$WORK/tensors.jsonl" | sed 's/^/   /' || true
  fi
  for f in "$log" "$CUFILE_LOG" "$SPEED" "$WORK/tensors.jsonl"; do
    [[ -s $f ]] && cp -f -- "$f" "$RESULTS/" 2>/dev/null
  done
  [[ -s cufile.log ]] && cp -f cufile.log "$RESULTS/cufile-cwd.log" 2>/dev/null
  echo "== logs: loaderd's and cuFile's, copied to $RESULTS"
  show_logs
  echo "== steps: $NSTEPS, each under a time limit (timeout --kill-after); hung: ${HUNG[*]:-none}; skipped (budget or GPU_LIMITS): ${SKIPPED[*]:-none}; ${SECONDS}s of ${BUDGET}s"
  ((${#HUNG[@]} == 0 && ${#SKIPPED[@]} == 0)) || status=1
  if [[ -n $loop ]]; then
    timeout 60 umount "$WORK/mnt" 2>/dev/null || true
    timeout 30 losetup -d "$loop" 2>/dev/null || true
    rm -f "$WORK/img"
  fi
  [[ -n $SAFE_LIBDIR ]] && rm -rf -- "$SAFE_LIBDIR"
  verdicts
  local head="every check passed"
  ((${#NOT_HERE[@]} == 0)) || head="every check this host can run passed; not possible here: cufile ($CUFILE_WHY)"
  ((status == 0)) || head="FAILURES (above)"
  echo "gpu: $head$([[ $STANDIN == 1 ]] && echo " (against the CUDA stand-in, not a GPU)")"
  exit $status
}
trap finish EXIT

echo "== loaderd check"
limited check 60 env "${LENV[@]}" "$LOADERD" check "${CHECK_LIB[@]}" --json >"$WORK/check.json" 2>/dev/null || true
bin_check=$(cat "$WORK/check.json")
limited check-text 60 env "${LENV[@]}" "$LOADERD" check "${CHECK_LIB[@]}" || true
if ! "$PY" -c 'import json, sys; r = json.loads(sys.argv[1]); sys.exit(0 if r.get("nvidia_driver", {}).get("ok") and r.get("cuda_runtime", {}).get("ok") else 1)' "$bin_check" 2>/dev/null; then
  echo "gpu: FAILED: $([[ $STANDIN == 1 ]] && echo "the stand-in is loaded" || echo "an NVIDIA driver is loaded"), but loaderd check finds no usable driver and CUDA runtime (above)"
  exit 1
fi

# GPU order: with two GPUs or more, the daemon sees them reversed.
DENV=() CENV=() DAEMON_DEV=()
ngpu=$("$PY" -c 'import json, sys; print(len(json.loads(sys.argv[1]).get("cuda_devices") or []))' "$bin_check" 2>/dev/null || echo 0)
if ((ngpu == 0)) && [[ $STANDIN != 1 ]] && command -v nvidia-smi >/dev/null; then
  ngpu=$(timeout 30 nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
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
elif ! timeout 30 losetup --find >/dev/null 2>&1; then why="losetup --find finds no free loop device"
fi
TFILES=$((FILES / 2 > 128 ? FILES / 2 : 128))  # 150528 bytes each; 8 batches of 8 a shard at least
NFILES=$TFILES                                  # the npy set: 224x224x3 float32 (602112 bytes of data)
((STANDIN == 1)) && NFILES=64
if [[ -z $why ]]; then
  echo "== data: an ext4 loop device, O_DIRECT ($FILES + $TFILES + $NFILES files)"
  mountpoint -q "$WORK/mnt" 2>/dev/null && timeout 60 umount "$WORK/mnt"
  rm -f "$WORK/img"
  truncate -s "$((4096 + NFILES * 3 / 4 + $(wc -w <<<"$TENSOR_SIZES") * TENSOR_MB * 115 / 100))M" "$WORK/img"
  limited mkfs 120 mkfs.ext4 -q -F -b 4096 "$WORK/img"
  loop=$(timeout 60 losetup --find --show --direct-io=on "$WORK/img")
  mkdir -p "$WORK/mnt" && limited mount 60 mount "$loop" "$WORK/mnt"
  data=$WORK/mnt
  BOUNCE=(file gds bam) RAWB=gds
else
  echo "== data: a plain directory on this machine's filesystem ($why): file and cufile only;"
  echo "   gds and bam skipped: they read raw block extents, which need the block device this script makes"
  data=$WORK/dir
  rm -rf "$data" && mkdir -p "$data"
  BOUNCE=(file) RAWB=file
fi
limited gendataset-train 300 "$GENDATA" --out "$data/train" --files "$FILES" --classes 100 --mean 110000 >/dev/null
limited gendataset-tensors 300 "$GENDATA" --out "$data/tensors" --files "$TFILES" --classes 10 --mean 150528 --sigma 0 >/dev/null
HAVE_NPY=1
if ! "$PY" -c 'import numpy' 2>/dev/null || [[ ! -f bench/npy_dataset.py ]]; then
  HAVE_NPY=0
  echo "   npy: skipped (numpy does not import in $PY, or bench/npy_dataset.py is missing)"
else
  limited npy-dataset 300 "$PY" bench/npy_dataset.py --out "$data/npy" --files "$NFILES" --shape 224,224,3 >/dev/null || HAVE_NPY=0
fi
sync
sets=(train tensors)
((HAVE_NPY)) && sets+=(npy)
for set in "${sets[@]}"; do
  reader=()
  [[ $set == npy ]] && reader=(--reader numpy)
  limited "mkbmap-$set" 300 "$MKBMAP" "${reader[@]}" --mountpoint "$data/$set" -o "$WORK/$set.bmap" >"$WORK/mkbmap.out" 2>&1 || status=1
  sed "s/^/   mkbmap $set: /" "$WORK/mkbmap.out"
done
# What real cuFile needs before it opens (docs/gpu.md, "Before the first
# run"): reported, not fixed; the daemon decides (auto: bounce, with the
# reason; cufile: an error naming it).
preconditions() {
  local dev rec proc=${NVFEED_CUFILE_PROC:-/proc} udev=${NVFEED_CUFILE_UDEV:-/run/udev} why=()
  echo "== cuFile's preconditions on this machine (what real libcufile needs; under --standin the fake host above stands for them)"
  if [[ -r $proc/modules ]]; then
    if grep -q '^nvidia_fs ' "$proc/modules"; then echo "   $proc/modules: yes; nvidia_fs loaded: GDS mode possible"
    else echo "   $proc/modules: yes; nvidia_fs NOT loaded: cuFile runs in compatibility mode (modprobe nvidia_fs for GDS)"; fi
  else
    echo "   $proc/modules: MISSING: real cuFileDriverOpen spins on this kernel; the daemon must not open cuFile here"
    why+=("no $proc/modules: the daemon refuses to open cuFile, whose driver open would hang")
  fi
  dev=$(stat -c '%Hd:%Ld' "$data" 2>/dev/null || echo '?')
  rec=$udev/data/b$dev
  if [[ -r $rec ]] && grep -q '^E:ID_FS_USAGE=' "$rec"; then echo "   udev record of the data's device ($dev): $rec, with ID_FS_USAGE"
  elif [[ -r $rec ]]; then
    echo "   udev record of the data's device ($dev): $rec, WITHOUT ID_FS_USAGE: cuFile refuses handles (5027)"
    why+=("$rec has no ID_FS_USAGE: cuFile refuses the data's files (5027)")
  else
    echo "   udev record of the data's device ($dev): MISSING ($rec): cuFile refuses handles (5027), compatibility mode too; start systemd-udevd${loop:+ (then udevadm trigger --action=add --sysname-match=$(basename "$loop"))}"
    why+=("no udev record $rec: cuFile refuses the data's files (5027)")
  fi
  if pgrep -x systemd-udevd >/dev/null 2>&1; then echo "   systemd-udevd: running"; else echo "   systemd-udevd: not running"; fi
  CUFILE_WHY=$(IFS=';'; echo "${why[*]}" | sed 's/;/; /g')
  [[ -z $CUFILE_WHY ]] || echo "   cufile: not possible here ($CUFILE_WHY): its steps run, and their failure is not counted; auto must take bounce"
  return 0
}
sock=$WORK/d.sock
start_daemon() {
  local i ds=(--dataset "train=$WORK/train.bmap" --dataset "tensors=$WORK/tensors.bmap")
  ((HAVE_NPY)) && ds+=(--dataset "npy=$WORK/npy.bmap")
  rm -f "$sock"
  env "${LENV[@]}" "${DENV[@]}" "$LOADERD" serve "${SERVE_LIB[@]}" --socket "$sock" "${ds[@]}" 2>>"$log" & d=$!
  NSTEPS=$((NSTEPS + 1))
  echo "   [step daemon-start: limit 30s]"
  for ((i = 0; i < 1500; i++)); do
    [[ -S $sock ]] && return 0
    kill -0 "$d" 2>/dev/null || break
    sleep 0.02
  done
  echo "gpu: loaderd did not start within 30s:"; show_logs; exit 1
}
# SIGTERM, 15 s, then SIGKILL (a daemon stuck in cuFile may ignore SIGTERM).
stop_daemon() {
  local i
  [[ -n $d ]] || return 0
  kill -TERM "$d" 2>/dev/null || true
  for ((i = 0; i < 150; i++)); do
    kill -0 "$d" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$d" 2>/dev/null; then
    echo "gpu: loaderd (pid $d) ignored SIGTERM for 15s: killed (SIGKILL)"
    HUNG+=(daemon-stop)
    kill -KILL "$d" 2>/dev/null || true
  fi
  wait "$d" 2>/dev/null || true
  d=
}
restart_daemon() { echo "   (restarting loaderd after a hung step)"; stop_daemon; start_daemon; }
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || echo "   (page cache not dropped: drop_caches is not writable here)"; }
# One exactness run as its own step; a hung one restarts the daemon.
check() {
  local name=$1 rc=0
  shift
  limited "exact:$name" 180 env "${CLIB[@]}" "${CENV[@]}" "$PY" bench/gpu_check.py exact --socket "$sock" \
    --consumer "$CONSUMER" "${DAEMON_DEV[@]}" "$@" || rc=$?
  verdict "${name##*/}" "exact:$name" "$rc" && return 0
  status=1
  ((rc == 124)) && restart_daemon
  return 0
}
# cuFile's mode from its own statistics; prints it, sets MODE.
cufile_mode() {
  local rc=0
  drop_caches
  limited cufile-mode 120 env "${LENV[@]}" "$LOADERD" bench "${BENCH_LIB[@]}" --bmap "$WORK/train.bmap" \
    --backend cufile --memory gpu --shuffle >"$WORK/cufile-mode.out" 2>&1 || rc=$?
  sed 's/^/   /' "$WORK/cufile-mode.out"
  MODE=$(grep -o 'cufile_mode=[a-z]*' "$WORK/cufile-mode.out" | tail -1 | cut -d= -f2 || true)
  echo "   cuFile ran in mode: ${MODE:-unknown}"
  MODES+=("${MODE:-unknown}")
  ((rc != 0)) || [[ -n $MODE ]] || rc=1
  verdict cufile cufile-mode "$rc" || status=1
}
# All exactness runs against the running daemon; $1 names the cuFile mode
# the daemon's cuFile runs in (gds: auto must pick cufile; compat: bounce).
exactness() {
  local b expect
  echo "== bytes, labels, zero copy, UUID and release: bounce x ${BOUNCE[*]}, and cufile; 2 epochs, 2 shards, shuffled"
  for b in "${BOUNCE[@]}"; do
    check "train/$b/bounce" --dataset train --root "$data/train" --backend "$b" --gpu-path bounce
  done
  check train/cufile --dataset train --root "$data/train" --backend cufile --gpu-path cufile
  echo "== dense batches (tensors: every sample 150528 bytes; batch_format=dali: one (batch, size) array)"
  check "tensors/$RAWB/bounce" --dataset tensors --root "$data/tensors" --backend "$RAWB" --gpu-path bounce --dense
  check tensors/cufile --dataset tensors --root "$data/tensors" --backend cufile --gpu-path cufile --dense
  if ((HAVE_NPY)); then
    echo "== dense tensor batches without DALI (npy: np.save'd float32 224x224x3; one (batch, 224, 224, 3) array)"
    check "npy/$RAWB/bounce" --dataset npy --root "$data/npy" --backend "$RAWB" --gpu-path bounce --tensor
    check npy/cufile --dataset npy --root "$data/npy" --backend cufile --gpu-path cufile --tensor
  fi
  echo "== cuFile's mode, from its own statistics (one cold epoch, loaderd bench)"
  cufile_mode
  case ${MODE:-} in gds) expect=cufile ;; compat) expect=bounce ;; *) expect= ;; esac
  [[ -z $CUFILE_WHY ]] || expect=bounce
  echo "== gpu_path auto (cuFile in ${MODE:-an unknown} mode: expected ${expect:-either})"
  check train/auto --dataset train --root "$data/train" --gpu-path auto ${expect:+--expect-path "$expect"}
}
# Step 6: each row its own process and step; $1 rounds.
speed_rows() {
  local row rc
  echo "== samples/s into GPU memory, bytes only (drop_caches before each round); each row on its own"
  for row in cufile bounce host baseline; do
    rc=0
    limited "speed:$row" 150 env "${CLIB[@]}" "${CENV[@]}" "$PY" bench/gpu_check.py speed --row "$row" \
      --socket "$sock" --root "$data/train" --bounce-backend "$RAWB" --rounds "$1" --out "$SPEED" || rc=$?
    if ((rc == 124)); then
      printf '{"row": "%s", "rounds": [], "error": "hung: killed at its limit"}\n' "$row" >>"$SPEED"
      restart_daemon
    fi
    # A reference's failure is shown, not counted: it says nothing of loaderd.
    if ((rc != 125)) && [[ $row != baseline ]]; then verdict "$row" "speed:$row" "$rc" || status=1; fi
  done
}

# Step 7: tensors into GPU memory. Appends to status only for loaderd's
# own failures; a missing piece skips, saying which.
tensor_speed() {
  local why='' f size shape batch tbytes n root map c name cmd b0 b1 r rc
  local res=$WORK/tensors.jsonl
  echo "== tensors into GPU memory: loaderd bench --memory gpu (cufile; $RAWB bounce) vs fn.readers.numpy(device=\"gpu\"), torch (cold)"
  for f in bench/npy_dataset.py bench/tensor_read.py bench/tensor_compare.py; do
    [[ -f $f ]] || why="$f is missing (copy it: this script's header says what)"
  done
  [[ -z $why ]] && ! "$PY" -c 'import numpy' 2>/dev/null && why="numpy does not import in $PY"
  [[ -z $TENSOR_SIZES ]] && why="TENSOR_SIZES is empty"
  if [[ -n $why ]]; then echo "   skipped: $why"; return 0; fi
  local dali_why='' torch_why=''
  timeout 60 "$PY" -c 'import nvidia.dali' 2>/dev/null || dali_why="DALI does not import in $PY (pip install nvidia-dali-cuda130 for this reference)"
  timeout 60 env "${CLIB[@]}" "${CENV[@]}" "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null ||
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
    rc=0
    limited "tensor:$size:data" 300 "$PY" bench/npy_dataset.py --out "$root" --files "$n" --shape "$shape" >/dev/null || rc=$?
    sync
    ((rc == 0)) && { limited "tensor:$size:mkbmap" 300 "$MKBMAP" --reader numpy --mountpoint "$root" -o "$map" >"$WORK/mkbmap.out" 2>&1 || rc=$?; }
    sed "s/^/   mkbmap npy-$size: /" "$WORK/mkbmap.out"
    ((rc == 0)) && { limited "tensor:$size:probe" 120 env "${LENV[@]}" "${CENV[@]}" "$LOADERD" bench "${BENCH_LIB[@]}" --bmap "$map" \
      --batch-size "$batch" --batches 1 --json >/dev/null 2>"$WORK/tensor-case.err" || rc=$?; }
    if ((rc != 0)); then
      if grep -q "not served" "$WORK/tensor-case.err" 2>/dev/null; then
        echo "   skipped: this loaderd refuses tensor maps (it predates tensor serving): build bin/ from a tree that serves them"
        rm -rf "$root"
        return 0
      fi
      echo "   FAILED: the $size tensor set (data, map or a first batch): $(tail -1 "$WORK/tensor-case.err" 2>/dev/null)"
      ((rc == 125)) || status=1
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
        rc=0
        # shellcheck disable=SC2086 # cmd is a command line of plain words
        limited "tensor:$size:$name:r$r" 120 ${cmd//@R/$r} >"$WORK/tensor-case.out" 2>"$WORK/tensor-case.err" || rc=$?
        if ((rc != 0)); then
          failed+=("$name")
          local err
          err=$( ((rc == 124)) && echo "hung: killed at its limit" || tail -1 "$WORK/tensor-case.err")
          echo "   $name failed: $err"
          if [[ $name == "loaderd gpu cufile" && $rc != 125 ]]; then verdict cufile "tensor:$size:$name" "$rc" || status=1
          elif [[ $name == loaderd* && $rc != 125 ]]; then status=1; fi
          skip_case "$name" "$where" "$size" "failed: $err"
          continue
        fi
        b1=$(devread)
        "$PY" bench/tensor_compare.py tag --case "$name" --round "$r" --device "$where" \
          --size "$size" --dev-bytes $((b0 < 0 ? -1 : b1 - b0)) --tensor-bytes "$tbytes" --shape "$shape" \
          --batch "$batch" --files "$n" <"$WORK/tensor-case.out" >>"$res"
      done
    done
    rm -rf "$root"
  done
}

if [[ $STANDIN == 1 ]]; then
  # The stand-in's cuFile refuses a device without a udev record (5027) as
  # real cuFile does, and the daemon checks /proc/modules before it opens
  # cuFile: a fake host meets both (python/tests/standin.py's cufile_host).
  # STANDIN_CUFILE_HOST=bare: a host with neither (cufile not possible).
  fake=$WORK/cufile-host
  rm -rf "$fake" && mkdir -p "$fake/proc" "$fake/udev/data"
  export NVFEED_CUFILE_PROC=$fake/proc NVFEED_CUFILE_UDEV=$fake/udev
  if [[ ${STANDIN_CUFILE_HOST:-} == bare ]]; then
    echo "== the stand-in's host: cuFile's preconditions unmet in $fake (STANDIN_CUFILE_HOST=bare: no modules list, no udev record)"
  else
    echo "ext4 1003520 1 - Live 0x0000000000000000" >"$fake/proc/modules"
    echo "E:ID_FS_USAGE=filesystem" >"$fake/udev/data/b$(stat -c '%Hd:%Ld' "$data")"
    echo "== the stand-in's host: cuFile's preconditions met by $fake (NVFEED_CUFILE_PROC, NVFEED_CUFILE_UDEV)"
  fi
fi
preconditions
start_daemon
if [[ $STANDIN == 1 ]]; then
  echo "#### stand-in, cuFile in GDS mode (CUFILE_STANDIN_MODE=gds)"
  export CUFILE_STANDIN_MODE=gds
  exactness
  [[ ${MODE:-} == gds || -n $CUFILE_WHY ]] || { echo "gpu: FAILED: the stand-in's cuFile ran in GDS mode, loaderd bench read ${MODE:-nothing}"; status=1; }
  stop_daemon
  echo "#### stand-in, cuFile in compatibility mode (CUFILE_STANDIN_MODE=compat)"
  export CUFILE_STANDIN_MODE=compat
  start_daemon
  exactness
  [[ ${MODE:-} == compat || -n $CUFILE_WHY ]] || { echo "gpu: FAILED: the stand-in's cuFile ran in compat mode, loaderd bench read ${MODE:-nothing}"; status=1; }
  echo "== speed against the stand-in: a dry run of the rows (its figures say nothing about a GPU)"
  speed_rows 1
  stop_daemon
  echo "== step 7 against the stand-in: a dry run of the tensor run's steps (its figures say nothing)"
  tensor_speed
  echo "== the stand-in's reports (every process: violations, what was left live at exit)"
  limited standin-report 60 "$PY" bench/gpu_check.py report --dir "$REPORT" || status=1
else
  exactness
  speed_rows 3
  stop_daemon
  tensor_speed
fi
exit "$status"
