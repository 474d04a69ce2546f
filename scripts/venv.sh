#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Makes .venv with the pinned Python packages (python/requirements.txt) and,
# where it installs, DALI (python/requirements-dali.txt; the DALI tests skip
# and say why when it does not) and PyTorch for CPU (python/requirements-torch.txt,
# --no-deps: that file lists all it needs; the torch tests skip, or fail under
# NVFEED_REQUIRE_PRIVILEGED=1, without it), then installs the client package itself
# (pip install ./python: the distribution nvfeed, the package nvfeed and
# the module dali_source, its DALI external_source shim). Idempotent: reinstalls the requirements only
# when they changed; the client (a second) every time.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.requirements
want=$(cat python/requirements.txt python/requirements-dali.txt python/requirements-torch.txt)
if ! [[ -x .venv/bin/python ]] || [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "venv: installing python/requirements.txt into .venv" >&2
  [[ -x .venv/bin/python ]] || python3 -m venv .venv  # .venv may be a link to a shared one
  .venv/bin/python -m pip install -q --disable-pip-version-check -r python/requirements.txt
  echo "venv: installing DALI (python/requirements-dali.txt, about 500 MB)" >&2
  if ! out=$(.venv/bin/python -m pip install -q --disable-pip-version-check -r python/requirements-dali.txt 2>&1); then
    echo "venv: DALI could not be installed; the DALI tests will skip. pip said:" >&2
    echo "$out" | tail -5 >&2
  fi
  echo "venv: installing PyTorch (python/requirements-torch.txt, about 2.4 GB to download, 4.3 GB installed)" >&2
  if ! out=$(.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r python/requirements-torch.txt 2>&1); then
    echo "venv: PyTorch could not be installed; the torch tests will skip. pip said:" >&2
    echo "$out" | tail -5 >&2
  fi
  printf '%s' "$want" > "$stamp"
fi
# A venv made before the client took the project's name holds it as the
# distribution nvfeed-dali-source, whose files (dali_source/) nvfeed's would
# overlap: it goes first.
if .venv/bin/python -m pip show -q nvfeed-dali-source >/dev/null 2>&1; then
  .venv/bin/python -m pip uninstall -q -y --disable-pip-version-check nvfeed-dali-source
fi
# setuptools builds in python/build and keeps what an earlier build put
# there: a module since removed from the tree (the former dali_source/
# package) would come back into the install, shadowing its successor.
rm -rf python/build
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation ./python
