#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the CUDA stand-in into OUTDIR: libcuda.so.1 (the driver API and
# all state), libcudart.so.13 and libcufile.so.0 (both linking
# libcuda.so.1 from their own directory: DT_RPATH $ORIGIN, searched before
# LD_LIBRARY_PATH, so a real driver on that path is not picked). Needs only a C
# compiler ($CC, default cc) and no NVIDIA file. Idempotent: each library
# is written to a temporary name and renamed. Prints OUTDIR.
set -euo pipefail
out=${1:?usage: build.sh OUTDIR}
src=$(cd "$(dirname "$0")" && pwd)
cc=${CC:-cc}
flags=(-std=c11 -shared -fPIC -O1 -g -Wall -Wextra -Wno-unused-parameter -Werror -pthread -I "$src")
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$cc" "${flags[@]}" -Wl,-soname,libcuda.so.1 -o "$tmp/libcuda.so.1" "$src/cuda.c" -ldl
for lib in cudart:libcudart.so.13 cufile:libcufile.so.0; do
  "$cc" "${flags[@]}" -Wl,-soname,"${lib#*:}" -Wl,-rpath,'$ORIGIN' -Wl,--disable-new-dtags -Wl,--no-as-needed \
    -o "$tmp/${lib#*:}" "$src/${lib%%:*}.c" "$tmp/libcuda.so.1"
done
for f in libcuda.so.1 libcudart.so.13 libcufile.so.0; do
  mv -f "$tmp/$f" "$out/$f"
done
echo "$out"
