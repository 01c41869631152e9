#!/usr/bin/env bash
# The main job: execute the notebook top to bottom. On a GPU this is the full benchmark and it
# writes results/<gpu>/ (JSON, plots, the executed notebook); without one it runs in CPU mode
# (Triton's interpreter, small shapes, exactness only) and writes results/cpu/ (not committed).
# Pass --no-install on a machine that already has the packages (the GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
if [ "${1:-}" != "--no-install" ]; then
  if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    python3 -m pip install -q -r <(grep -v unsloth requirements.txt)
    python3 -m pip install -q --no-deps unsloth==2026.10.9 unsloth_zoo==2026.10.9
  else
    [ -x .venv/bin/python ] || python3 -m venv .venv
    .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-cpu.txt
    PY=.venv/bin/python
  fi
fi
"$PY" - <<'PY'
import nbformat, torch
from nbclient import NotebookClient
import helpers
notebook = nbformat.read("Unsloth_Puzzles_NF4.ipynb", as_version=4)
NotebookClient(notebook, timeout=1800, kernel_name="python3", record_timing=False,
               resources={"metadata": {"path": "."}}).execute()
notebook.metadata.pop("widgets", None)
out = helpers.results_dir(helpers.environment()) / "Unsloth_Puzzles_NF4.ipynb"
nbformat.write(notebook, out)
print("executed notebook:", out)
PY
