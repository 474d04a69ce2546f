#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU path on a GPU machine, in one command. Takes the binaries built
# on a machine with Go and the client from python/ (no install needed).
# Build them so that they run on the GPU machine's glibc: without cgo,
#   CGO_ENABLED=0 go build -trimpath -ldflags "-X main.version=$(cat python/nvfeed/VERSION)" -o bin/ ./cmd/... ./tools/...
# (libc only, no versioned symbol; `loaderd check` then lacks its NVML
# probe), or with cgo (`make build`: NVML too) where that machine's glibc is
# at least the build machine's. Carry bin/. On a machine without an NVIDIA driver it says "no GPU" and
# exits 0.
#
# It runs `loaderd check`; builds a small ImageNet-shaped set on an ext4
# loop device; serves it; for the bounce path (the backend reads into
# page-locked staging memory, one copy per batch to the device) x file,
# gds, bam, and for the cufile path (cuFileRead straight into the slots),
# a client process receives GPU batches for two epochs, two shards,
# shuffled, copies every sample back with PyTorch or CuPy and compares
# bytes and labels with the files, and checks zero copy (the consumer's
# pointer lies inside the imported allocation); it reports whether cuFile
# ran in GDS or compatibility mode from cuFile's own statistics (loaderd
# bench --backend cufile --memory gpu); then it times samples/s into GPU
# memory (cufile; gds through bounce) against host gds and a PyTorch
# baseline (read each file, torch.frombuffer(...).cuda()), cold, in one
# run.
#
# Needs root (loop device, drop_caches). Usage: bench/gpu.sh [FILES]
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${1:-2000}
if [[ ! -e /proc/driver/nvidia/version ]]; then
  echo "gpu: no GPU (no NVIDIA driver here): nothing to run"
  exit 0
fi
[[ $(id -u) == 0 ]] || { echo "gpu: needs root (loop device, drop_caches)" >&2; exit 1; }
for b in loaderd mkbmap gendataset; do
  [[ -x bin/$b ]] || { echo "gpu: bin/$b missing: run make build where Go is, and carry bin/" >&2; exit 1; }
done
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
. bench/lib.sh
d=
cleanup() {
  [[ -n $d ]] && { kill -TERM "$d" 2>/dev/null; wait "$d" 2>/dev/null || true; }
  bench_cleanup
}
trap cleanup EXIT
echo "== loaderd check"
bin/loaderd check || true
# The machine's own disk (an image file on it, as bench's "virtio" device).
FILES=$FILES bench_dataset virtio "$PWD/.bench/gpu"
w=$bench_work
echo "== loaderd check --dataset"
bin/loaderd check --dataset "train=$w/train.bmap" || true
rm -f "$w/d.sock"
bin/loaderd serve --socket "$w/d.sock" --dataset "train=$w/train.bmap" 2>"$w/loaderd.log" & d=$!
while [[ ! -S $w/d.sock ]]; do kill -0 "$d" || { cat "$w/loaderd.log"; exit 1; }; sleep 0.02; done
status=0
echo "== bytes, labels and zero copy: bounce x file, gds, bam, and cufile; 2 epochs, 2 shards, shuffled"
for backend in file gds bam; do
  "$PY" bench/gpu_check.py exact --socket "$w/d.sock" --root "$w/mnt/train" --backend "$backend" --gpu-path bounce || status=1
done
"$PY" bench/gpu_check.py exact --socket "$w/d.sock" --root "$w/mnt/train" --backend cufile --gpu-path cufile || status=1
echo "== cuFile's mode, from its own statistics (one cold epoch)"
drop
bin/loaderd bench --bmap "$w/train.bmap" --backend cufile --memory gpu --shuffle || status=1
echo "== samples/s, cold (drop_caches before each)"
"$PY" bench/gpu_check.py speed --socket "$w/d.sock" --root "$w/mnt/train" || status=1
echo "== daemon log (tail)"
tail -5 "$w/loaderd.log"
exit $status
