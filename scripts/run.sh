#!/usr/bin/env bash
# The main job: execute the notebook top to bottom, then say in a few lines what it found.
#   bash scripts/run.sh              a GPU python3 sees: the full benchmark into results/<gpu>/ (JSON, plots, the
#                                    executed notebook, results/<gpu>.zip); none: CPU mode in .venv (Triton's
#                                    interpreter, small shapes, exactness only), results/cpu/Unsloth_Puzzles_NF4.ipynb
#   bash scripts/run.sh --no-install the same with the packages already there (the GPU machine)
#   bash scripts/run.sh --cpu        CPU mode even where there is a GPU
set -euo pipefail
cd "$(dirname "$0")/.."
SCRIPT=run.sh
source scripts/venv.sh

PY=python3
if [ "${1:-}" = "--cpu" ] || ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  if [ "${1:-}" != "--cpu" ] && nvidia-smi -L >/dev/null 2>&1; then
    say "nvidia-smi sees a GPU, but python3 cannot use it: $(python3 -c 'import torch; print(f"torch {torch.__version__}, a build without CUDA")' 2>/dev/null || echo 'it has no torch')."
    say "Install torch for this GPU into python3 (https://pytorch.org/get-started/locally/), then run this again;"
    say "or run bash scripts/run.sh --cpu for the CPU mode."
    exit 1
  fi
  say "CPU mode, in .venv"
  cpu_venv
  PY=.venv/bin/python
elif [ "${1:-}" != "--no-install" ]; then
  say "GPU found: installing requirements.txt into $(command -v python3), keeping its torch and triton"
  pip_install python3 -m pip install -r <(grep -v unsloth requirements.txt) \
    -c <(python3 -c "import torch, triton; print(f'torch=={torch.__version__}\ntriton=={triton.__version__}')")
  say "installing unsloth's kernels (unsloth and unsloth_zoo without their dependencies)"
  pip_install python3 -m pip install --no-deps unsloth==2026.10.9 unsloth_zoo==2026.10.9
fi
say "executing Unsloth_Puzzles_NF4.ipynb with $("$PY" -c 'import torch, triton; print(f"torch {torch.__version__}, triton {triton.__version__}")')"
"$PY" - <<'PY'
import time
import nbformat
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
import helpers
import report
notebook = nbformat.read(helpers.NOTEBOOK_NAME, as_version=4)
started = time.time()
kernel = KernelManager(kernel_name="python3", transport="ipc")  # on this machine: no TCP, so no plain-text warning
try:
    NotebookClient(notebook, km=kernel, timeout=1800, record_timing=False,
                   resources={"metadata": {"path": "."}}).execute()
finally:
    kernel.shutdown_kernel(now=True)
notebook.metadata.pop("widgets", None)
# the folder the run wrote: its GPU's, or the one it answered as (a startup file can make it answer as a T4)
written = [path.parent for path in helpers.ROOT.glob("results/*/notebook.json") if path.stat().st_mtime >= started]
directory = written[0] if len(written) == 1 else helpers.results_dir(helpers.environment())
nbformat.write(notebook, directory / helpers.NOTEBOOK_NAME)
packed = helpers.pack_run(directory) if (directory / "notebook.json").exists() else None  # with the notebook
print("\n".join(report.run_summary(notebook, directory, packed)))
if packed:  # (for the maintainer at this terminal; the notebook's own pages say nothing of it)
    print(f"To make it the repository's: python -m benchmarks.adopt {helpers.shown_path(directory.with_suffix('.zip'))}")
PY
