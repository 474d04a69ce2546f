#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs what the demo and the tests need on a fresh machine:
#  - Debian packages (xfsprogs, btrfs-progs, e2fsprogs, fio, util-linux, acl, and gcc with libc6-dev:
#    the tests build the CUDA stand-in with the system C compiler), through apt when
#    running as root and a tool is missing;
#  - a Go toolchain >= the go.mod version, from the Go module proxy, into
#    .tools/go when `go` is missing or too old.
#  - staticcheck, pinned, into .tools/bin.
# `deps.sh wheel` installs only what `make wheel` needs: the Go toolchain,
# objcopy (binutils), curl and unzip (to fetch Go) and python3 (the stdlib
# writes the wheel); no test tools, no staticcheck.
# Prints nothing but what it installs. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
case $mode in all|wheel) ;; *) echo "usage: deps.sh [wheel]" >&2; exit 2;; esac

pairs=(objcopy:binutils curl:curl unzip:unzip python3:python3)
if [[ $mode == all ]]; then
  pairs+=(mkfs.xfs:xfsprogs mkfs.btrfs:btrfs-progs mkfs.ext4:e2fsprogs filefrag:e2fsprogs fio:fio losetup:mount setfacl:acl cc:gcc cc:libc6-dev)
fi
missing=()
for pair in "${pairs[@]}"; do
  tool=${pair%%:*} pkg=${pair#*:}
  command -v "$tool" >/dev/null 2>&1 || [[ -x /usr/sbin/$tool || -x /sbin/$tool ]] || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "deps: installing ${missing[*]}" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "deps: missing ${missing[*]} (run as root with apt to install); tests that need them will skip" >&2
  fi
fi

want=$(sed -n 's/^go \([0-9.]*\).*/\1/p' go.mod)
have=$(go env GOVERSION 2>/dev/null | sed 's/^go//' || true)
if [[ -z $have ]] || [[ $(printf '%s\n%s\n' "$want" "$have" | sort -V | head -1) != "$want" ]]; then
  if [[ ! -x .tools/go/bin/go ]]; then
    ver=1.26.8
    echo "deps: installing Go $ver into .tools/go (found '${have:-none}', need $want)" >&2
    mkdir -p .tools
    curl -fsSL -o .tools/go.zip "https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-go${ver}.linux-$(dpkg --print-architecture 2>/dev/null || echo amd64).zip"
    rm -rf .tools/golang.org* .tools/go && (cd .tools && unzip -q go.zip) && mv .tools/golang.org/toolchain@*/ .tools/go && rm -rf .tools/go.zip .tools/golang.org
    chmod +x .tools/go/bin/* .tools/go/pkg/tool/*/* 2>/dev/null || true
  fi
fi

[[ $mode == wheel ]] && exit 0

# staticcheck, pinned, into .tools/bin (make test runs it).
staticcheck_ver=v0.8.2
if ! [[ -x .tools/bin/staticcheck ]] || ! .tools/bin/staticcheck -version 2>/dev/null | grep -q "(${staticcheck_ver#v})"; then
  echo "deps: installing staticcheck $staticcheck_ver into .tools/bin" >&2
  PATH=$PWD/.tools/go/bin:$PATH GOBIN=$PWD/.tools/bin go install "honnef.co/go/tools/cmd/staticcheck@$staticcheck_ver"
fi
