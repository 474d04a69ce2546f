#!/usr/bin/env bash
# Makes .venv with the pinned Python packages (python/requirements.txt).
# Idempotent: reinstalls only when the requirements changed.
set -euo pipefail
cd "$(dirname "$0")/.."
req=python/requirements.txt
stamp=.venv/.requirements
if [[ -x .venv/bin/python ]] && cmp -s "$req" "$stamp" 2>/dev/null; then exit 0; fi
python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -r "$req"
cp "$req" "$stamp"
