#!/usr/bin/env bash
# Every test (what CI runs). Installs the CPU test environment into .venv and runs the suite; then,
# for each Triton in NF4_TRITONS, a small venv .venv-triton-<version> (that Triton, everything else
# from .venv) runs the tests that depend on the Triton version: interpreter exactness, layouts, the
# offline sm_75 / sm_90 compiles and the launch path. GPU tests are skipped without a GPU.
#   bash scripts/test.sh               install, the suite, the Triton matrix
#   NF4_TRITONS="3.2.0" bash scripts/test.sh    another matrix ("" for none)
#   bash scripts/test.sh --no-install  the suite alone, with the python3 on PATH (the GPU machine)
set -uo pipefail
cd "$(dirname "$0")/.."
TRITONS=${NF4_TRITONS-3.2.0 3.3.1 3.4.0 3.5.1 3.7.1 3.8.0 3.9.0}
VERSION_TESTS="tests/test_exactness.py tests/test_layouts.py tests/test_compile_targets.py
               tests/test_launch_offline.py tests/test_launch_path.py"
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
export TRITON_CACHE_DIR="$LOGS/triton-cache"  # every run compiles afresh, as on a new machine
SCRIPT=test.sh
source scripts/venv.sh

PY=python3
if [ "${1:-}" != "--no-install" ]; then
  cpu_venv || exit 1
  PY=.venv/bin/python
else
  TRITONS=""
fi

triton_of() { "$1" -c "import triton; print(triton.__version__)"; }
SUMMARY=()
FAILED=0
# run_part NAME PYTHON TESTS...: pytest with PYTHON, its summary line kept for the end
run_part() {
  local name=$1 python=$2
  shift 2
  say "$name: pytest with triton $(triton_of "$python") ($python)"
  "$python" -m pytest -q -p no:cacheprovider "$@" 2>&1 | tee "$LOGS/part.log"
  local status=${PIPESTATUS[0]}
  local line
  line=$(grep -E '^=* ?[0-9]+ (passed|failed|skipped|error|errors|deselected)' "$LOGS/part.log" | tail -1 | tr -d '=')
  [ -n "$line" ] || line="1 error (pytest ended without a summary, exit $status)"
  [ "$status" -eq 0 ] || FAILED=1
  SUMMARY+=("$(printf '%-14s triton %-6s %s' "$name" "$(triton_of "$python")" "$line")")
  echo "$line" >> "$LOGS/counts"
}

site_packages() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
# the venv for one Triton: its own site-packages first, then .venv's through a .pth file
triton_venv() {
  local version=$1 venv=".venv-triton-$1"
  if [ ! -x "$venv/bin/python" ] || [ "$(triton_of "$venv/bin/python" 2>/dev/null)" != "$version" ]; then
    say "triton $version: creating $venv and installing triton==$version (about 200 MB)"
    rm -rf "$venv"
    "$PY" -m venv --without-pip "$venv" || return 1
    site_packages "$PY" > "$(site_packages "$venv/bin/python")/nf4_main_venv.pth"
    pip_install "$PY" -m pip --python "$venv/bin/python" install --no-deps "triton==$version" || return 1
  fi
  [ "$(triton_of "$venv/bin/python")" = "$version" ]
}

say "the suite with .venv's triton, then the Triton matrix: ${TRITONS:-none}"
run_part "main suite" "$PY" tests
for version in $TRITONS; do
  if triton_venv "$version"; then
    run_part "triton $version" ".venv-triton-$version/bin/python" $VERSION_TESTS
  else
    say "triton $version: the venv could not be made"
    SUMMARY+=("$(printf '%-14s triton %-6s %s' "triton $version" "$version" "1 error (no venv)")")
    echo "1 error" >> "$LOGS/counts"
    FAILED=1
  fi
done

say "summary"
printf '  %s\n' "${SUMMARY[@]}"
# the closing line, as pytest writes it: every part's counts added up
"$PY" - "$LOGS/counts" $((SECONDS - START)) <<'PY'
import re, sys
totals = {}
for line in open(sys.argv[1]):
    for count, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)", line):
        kind = "errors" if kind.startswith("error") else kind
        totals[kind] = totals.get(kind, 0) + int(count)
order = ["failed", "passed", "skipped", "deselected", "xfailed", "xpassed", "errors"]
parts = [f"{totals[k]} {'error' if k == 'errors' and totals[k] == 1 else k}" for k in order if totals.get(k)]
parts = parts or ["no tests ran"]
print(f"======== {', '.join(parts)} in {float(sys.argv[2]):.2f}s ========")
PY
exit $FAILED
