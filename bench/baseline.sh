#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# make bench's before and after: this tree against an earlier commit
# (the baseline), side by side in one run, so that a refactor can be shown
# to cost nothing. The baseline is exported with `git archive` and built
# apart (.bench/baseline); then
#   1. bench/ab.sh on the RAM and the virtio device: `loaderd bench` of the
#      baseline and of this tree, gds, bam and file, cold, alternating;
#   2. bench/e2e_ab.sh on the RAM device: each version's daemon read by
#      that version's own Python client (`LoaderSource` in a CPU DALI
#      pipeline, batch 64, bytes to an operator), file and gds, as root.
# Within noise means the medians' ratios sit inside the rounds' spread.
#
# Needs root, the binaries from `make build` and the venv.
# Usage: bench/baseline.sh REV ROUNDS   (env: FILES, default 12000)
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -eq 2 ]] || { sed -n '3,15p' "$0" >&2; exit 2; }
rev=$1 rounds=$2
base=$PWD/.bench/baseline
rm -rf "$base"
mkdir -p "$base/src"
git archive "$(git rev-parse --verify "$rev^{commit}")" | tar -x -C "$base/src"
(cd "$base/src" && go build -o "$base/bin/" ./cmd/loaderd)
echo "baseline: $(git log -1 --format='%h %cs %s' "$rev")"
echo "current:  $(git log -1 --format='%h %cs %s' HEAD)$(git diff --quiet HEAD -- . ':!bench/RESULTS.md' || echo ' (with uncommitted changes)')"
echo
cases=()
for b in gds bam file; do
  cases+=("before-$b=$base/bin/loaderd bench --backend $b" "after-$b=bin/loaderd bench --backend $b")
done
for dev in ram virtio; do
  bash bench/ab.sh "$dev" "$rounds" "${cases[@]}"
  echo
done
OLD_PYTHON=$base/src/python USERS=root bash bench/e2e_ab.sh ram "$rounds" "$base/bin/loaderd" bin/loaderd
