#!/usr/bin/env bash
# Install the CPU test environment into .venv and run every test. GPU tests are skipped without a
# GPU; on a GPU machine with torch, triton, bitsandbytes and unsloth present, pass --no-install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
if [ "${1:-}" != "--no-install" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-cpu.txt
  PY=.venv/bin/python
  # a CUDA build here would mean GBs of downloads and a different code path: refuse it
  "$PY" -c "import torch, sys; sys.exit('a CUDA build of torch is installed; CI needs the CPU build' if torch.version.cuda else 0)"
fi
exec "$PY" -m pytest -q -p no:cacheprovider tests
