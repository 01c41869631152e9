#!/usr/bin/env bash
# The main job: execute the notebook top to bottom. On a GPU this is the full benchmark and it
# writes results/<gpu>/ (JSON, plots, the executed notebook); without one it runs in CPU mode
# (Triton's interpreter, small shapes, exactness only), writes no results and saves the executed
# notebook as results/cpu/Unsloth_Puzzles_NF4.ipynb (not committed).
# Pass --no-install on a machine that already has the packages (the GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
say() { printf '[run.sh %3dm%02ds] %s\n' $(((SECONDS - START) / 60)) $(((SECONDS - START) % 60)) "$*"; }
# pip, showing what it downloads and installs, not every satisfied requirement; fails as pip fails
pip_install() {
  "$@" 2>&1 | awk '/^ *(Collecting|Downloading|Installing collected|Successfully installed|ERROR|error)/ {
    print "    " $0; fflush() }'
}

PY=python3
if [ "${1:-}" != "--no-install" ]; then
  if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    say "GPU found: installing requirements.txt into $(command -v python3), keeping its torch and triton"
    pip_install python3 -m pip install --disable-pip-version-check -r <(grep -v unsloth requirements.txt) \
      -c <(python3 -c "import torch, triton; print(f'torch=={torch.__version__}\ntriton=={triton.__version__}')")
    say "installing unsloth's kernels (unsloth and unsloth_zoo without their dependencies)"
    pip_install python3 -m pip install --disable-pip-version-check --no-deps unsloth==2026.10.9 unsloth_zoo==2026.10.9
  else
    say "no GPU: CPU mode, in .venv"
    if [ ! -x .venv/bin/python ]; then
      say "creating .venv"
      python3 -m venv .venv
    fi
    say "installing requirements-cpu.txt into .venv (a first run downloads about 1 GB: minutes)"
    pip_install .venv/bin/python -m pip install --disable-pip-version-check -r requirements-cpu.txt
    PY=.venv/bin/python
  fi
fi
say "executing Unsloth_Puzzles_NF4.ipynb with $("$PY" -c 'import torch, triton; print(f"torch {torch.__version__}, triton {triton.__version__}")')"
"$PY" - <<'PY'
import nbformat
from nbclient import NotebookClient
import helpers
notebook = nbformat.read("Unsloth_Puzzles_NF4.ipynb", as_version=4)
NotebookClient(notebook, timeout=1800, kernel_name="python3", record_timing=False,
               resources={"metadata": {"path": "."}}).execute()
notebook.metadata.pop("widgets", None)
out = helpers.results_dir(helpers.environment()) / "Unsloth_Puzzles_NF4.ipynb"
nbformat.write(notebook, out)
print("executed notebook:", out.relative_to(helpers.ROOT))
PY
say "done"
