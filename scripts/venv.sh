# Sourced by run.sh and test.sh: say (a timed progress line), pip_install (pip, its progress shown as it comes),
# cpu_venv (.venv: numpy, a CPU build of torch, requirements-cpu.txt) and triton_venv (one Triton, the rest .venv's).
START=$SECONDS
say() { printf '[%s %3dm%02ds] %s\n' "$SCRIPT" $(((SECONDS - START) / 60)) $(((SECONDS - START) % 60)) "$*"; }
# pip, showing what it downloads, takes from its cache and installs (not every satisfied requirement); fails as pip fails
pip_install() {
  PYTHONUNBUFFERED=1 "$@" --disable-pip-version-check --progress-bar off 2>&1 \
    | awk '/^ *(Collecting|Downloading|Using cached|Installing collected|Successfully installed|ERROR|error)/ {
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
      say "installing $torch_pin, the CPU build (a 200 MB wheel, 0.8 GB installed), from PyTorch's CPU index or pip's cache"
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

triton_of() { "$1" -c "import triton; print(triton.__version__)"; }
site_packages() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
# triton_venv PYTHON VERSION: .venv-triton-VERSION, triton==VERSION in its own site-packages, then PYTHON's (a .pth);
# pip's own line says where the wheel came from ('Using cached' or 'Downloading')
triton_venv() {
  local main_python=$1 version=$2 venv=".venv-triton-$2"
  if [ ! -x "$venv/bin/python" ] || [ "$(triton_of "$venv/bin/python" 2>/dev/null)" != "$version" ]; then
    # measured, wheel/venv in MB: 3.2.0 253/719, 3.3.1 155/566, 3.5.1 170/623, 3.8.0 247/941, 3.9.0 286/1048
    say "triton $version: creating $venv with triton==$version (a 155-286 MB wheel, 0.57-1.05 GB installed), from pip's cache or PyPI"
    rm -rf "$venv"
    "$main_python" -m venv --without-pip "$venv" || return 1
    site_packages "$main_python" > "$(site_packages "$venv/bin/python")/nf4_main_venv.pth"
    pip_install "$main_python" -m pip --python "$venv/bin/python" install --no-deps "triton==$version" || return 1
  fi
  [ "$(triton_of "$venv/bin/python")" = "$version" ]
}
