# Sourced by run.sh and test.sh: say (a timed progress line), pip_install (pip, its progress shown as it
# comes) and cpu_venv (.venv with a CPU build of torch, then requirements-cpu.txt; never a CUDA build).
START=$SECONDS
say() { printf '[%s %3dm%02ds] %s\n' "$SCRIPT" $(((SECONDS - START) / 60)) $(((SECONDS - START) % 60)) "$*"; }
# pip, showing what it downloads and installs as it goes (not every satisfied requirement); fails as pip fails
pip_install() {
  PYTHONUNBUFFERED=1 "$@" --disable-pip-version-check --progress-bar off 2>&1 \
    | awk '/^ *(Collecting|Downloading|Installing collected|Successfully installed|ERROR|error)/ {
             print "    " $0; fflush() }'
  return "${PIPESTATUS[0]}"
}

# .venv for a machine without a GPU: torch as requirements-cpu.txt pins it, a CPU build. Which build pip would
# take is asked first (a dry run reads metadata only): a +cpu wheel (as this project's machines keep on disk)
# is installed as it is; otherwise the same version comes from PyTorch's CPU index, never PyPI's CUDA build.
cpu_venv() {
  local py=.venv/bin/python torch_pin
  torch_pin=$(grep -E '^torch==' requirements-cpu.txt)
  if [ ! -x "$py" ]; then
    say "creating .venv"
    python3 -m venv .venv || return 1
  fi
  if ! "$py" -c "import torch" 2>/dev/null; then
    if "$py" -m pip install --dry-run --quiet --no-deps --report - "$torch_pin" 2>/dev/null | grep -q '"version": "[^"]*+cpu"'; then
      say "installing $torch_pin (a CPU build, found by pip)"
      pip_install "$py" -m pip install "$torch_pin" || return 1
    else
      say "installing $torch_pin, the CPU build, from PyTorch's CPU index (about 200 MB)"
      pip_install "$py" -m pip install --index-url https://download.pytorch.org/whl/cpu "$torch_pin" || return 1
    fi
  fi
  "$py" -c "import torch, sys; sys.exit(0 if torch.version.cuda is None else 1)" || {
    say ".venv holds a CUDA build of torch ($("$py" -c 'import torch; print(torch.__version__)')): remove .venv and run again"
    return 1
  }
  say "installing requirements-cpu.txt into .venv (a first run downloads about 700 MB: minutes)"
  pip_install "$py" -m pip install -r requirements-cpu.txt \
    -c <("$py" -c "import torch; print(f'torch=={torch.__version__}')") || return 1
}
