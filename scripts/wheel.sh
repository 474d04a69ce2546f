#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# make wheel: dist/nvfeed-VERSION-py3-none-manylinux_2_17_x86_64.whl, one
# pip install for a Python user: the client package (nvfeed, and the module
# dali_source, the DALI external_source shim over it) and the
# loaderd and mkbmap binaries as scripts, so both land on the environment's
# PATH. The binaries are built without cgo: they need only libc.so.6,
# libpthread.so.0 and libdl.so.2 and no versioned glibc symbol, so the
# wheel installs on any glibc x86_64 Linux that pip calls manylinux2014
# (Ubuntu 20.04+, RHEL 8+, and older). CUDA and cuFile are loaded at run
# time either way (purego); what a cgo build has beyond it is the NVML
# probe of `loaderd check` (go-nvml), which says so. `auditwheel show`
# (PyPI) checks the tag. The version comes from python/nvfeed/VERSION.
# Needs Go (scripts/deps.sh wheel), objcopy and a python3 (the standard
# library writes the wheel: scripts/mkwheel.py), not the development venv.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/.tools/go/bin:$PATH
command -v objcopy >/dev/null || { echo "wheel.sh: objcopy missing: install binutils (scripts/deps.sh wheel does, as root)" >&2; exit 1; }
version=$(cat python/nvfeed/VERSION)
out=build/wheel
rm -rf "$out" && mkdir -p "$out" dist
CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$out/" ./cmd/loaderd ./cmd/mkbmap
# Go's linker leaves empty symbol-version sections that no dynamic tag
# refers to; auditwheel's ELF reader cannot parse them. They carry nothing.
for b in "$out"/loaderd "$out"/mkbmap; do
  objcopy --remove-section .gnu.version_r --remove-section .gnu.version "$b"
done
"${PYTHON:-python3}" scripts/mkwheel.py --version "$version" --bin "$out" --out dist
