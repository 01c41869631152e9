# Sourced by run.sh and test.sh: say (a timed progress line), pip_install (pip, its progress shown as it
# comes) and cpu_venv (.venv with numpy, a CPU build of torch, then requirements-cpu.txt; never a CUDA build).
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
# numpy goes in first: torch imported without it prints a UserWarning ("Failed to initialize NumPy").
cpu_venv() {
  local py=.venv/bin/python torch_pin numpy_pin torch_version to_install
  torch_pin=$(grep -E '^torch==' requirements-cpu.txt)
  numpy_pin=$(grep -E '^numpy==' requirements-cpu.txt)
  if [ ! -x "$py" ]; then
    say "creating .venv"
    python3 -m venv .venv || return 1
  fi
  if ! "$py" -c "import numpy" 2>/dev/null; then
    say "installing $numpy_pin (before torch, which warns when imported without it)"
    pip_install "$py" -m pip install "$numpy_pin" || return 1
  fi
  if ! "$py" -c "import torch" 2>/dev/null; then
    if "$py" -m pip install --dry-run --quiet --no-deps --report - "$torch_pin" 2>/dev/null | grep -q '"version": "[^"]*+cpu"'; then
      say "installing $torch_pin (a CPU build, found by pip)"
      pip_install "$py" -m pip install "$torch_pin" || return 1
    else
      say "installing $torch_pin, the CPU build, from PyTorch's CPU index (a 200 MB download, 0.8 GB installed)"
      pip_install "$py" -m pip install --index-url https://download.pytorch.org/whl/cpu "$torch_pin" || return 1
    fi
  fi
  "$py" -c "import torch, sys; sys.exit(0 if torch.version.cuda is None else 1)" || {
    say ".venv holds a CUDA build of torch ($("$py" -c 'import torch; print(torch.__version__)')): remove .venv and run again"
    return 1
  }
  torch_version=$("$py" -c "import torch; print(torch.__version__)")
  # how many packages pip would install, asked first (a dry run): none on a later run, so no download to announce
  to_install=$("$py" -m pip install --dry-run --quiet --report - -r requirements-cpu.txt \
                 -c <(echo "torch==$torch_version") 2>/dev/null \
               | "$py" -c "import json, sys; print(len(json.load(sys.stdin)['install']))" 2>/dev/null) || to_install=""
  if [ "$to_install" = 0 ]; then
    say "requirements-cpu.txt: all installed in .venv already"
    return 0
  fi
  # a fresh .venv's 75 packages are 300 MB of wheels (pip download -r requirements-cpu.txt, Linux, Python 3.11)
  say "installing requirements-cpu.txt into .venv (${to_install:-some} missing; a fresh .venv's are 300 MB: minutes)"
  pip_install "$py" -m pip install -r requirements-cpu.txt -c <(echo "torch==$torch_version") || return 1
}
