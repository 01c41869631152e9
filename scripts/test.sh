#!/usr/bin/env bash
# Every test (what CI runs). Installs the CPU test environment into .venv and runs the suite; then,
# for each Triton in NF4_TRITONS, a venv .venv-triton-<version> (that Triton alone, 0.6-1 GB; everything
# else from .venv) runs the tests that depend on the Triton version: interpreter exactness, layouts, the
# offline sm_75 / sm_90 compiles and the launch path. GPU tests are skipped without a GPU.
#   bash scripts/test.sh               install, the suite, the Triton matrix
#   NF4_TRITONS="3.2.0" bash scripts/test.sh    another matrix ("" for none)
#   bash scripts/test.sh --no-install  the suite alone, with the python3 on PATH (the GPU machine)
set -uo pipefail
cd "$(dirname "$0")/.."
TRITONS=${NF4_TRITONS-3.2.0 3.3.1 3.4.0 3.5.1 3.7.1 3.8.0 3.9.0}
VERSION_TESTS="tests/test_exactness.py tests/test_layouts.py tests/test_compile_targets.py
               tests/test_launch_offline.py tests/test_launch_path.py tests/test_launch_fuzz.py"
VERSION_SELECTION="not fresh and not undone"  # the fuzzer on its fixed seed alone, per Triton
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

SUMMARY=()
FAILED=0
# run_part NAME PYTHON TESTS...: pytest with PYTHON, its summary line and skip reasons kept for the end
# (-rfEs: the short summary lists failures and errors, pytest's default, and skips with their reasons)
run_part() {
  local name=$1 python=$2
  shift 2
  say "$name: pytest with triton $(triton_of "$python") ($python)"
  "$python" -m pytest -q -rfEs -p no:cacheprovider "$@" 2>&1 | tee "$LOGS/part.log"
  local status=${PIPESTATUS[0]}
  local line pytest_summary='^=* ?[0-9]+ (passed|failed|skipped|deselected|warnings?|errors?)'  # its last line
  line=$(grep -E "$pytest_summary" "$LOGS/part.log" | tail -1 | tr -d '=')
  [ -n "$line" ] || line="1 error (pytest ended without a summary, exit $status)"
  [ "$status" -eq 0 ] || FAILED=1
  SUMMARY+=("$(printf '%-14s triton %-6s %s' "$name" "$(triton_of "$python")" "$line")")
  echo "$line" >> "$LOGS/counts"
  grep -E '^SKIPPED \[[0-9]+\] ' "$LOGS/part.log" >> "$LOGS/skips"
}

say "the suite with .venv's triton, then the Triton matrix: ${TRITONS:-none}"
run_part "main suite" "$PY" tests
for version in $TRITONS; do
  if triton_venv "$PY" "$version"; then
    run_part "triton $version" ".venv-triton-$version/bin/python" $VERSION_TESTS -k "$VERSION_SELECTION"
  else
    say "triton $version: the venv could not be made"
    SUMMARY+=("$(printf '%-14s triton %-6s %s' "triton $version" "$version" "1 error (no venv)")")
    echo "1 error" >> "$LOGS/counts"
    FAILED=1
  fi
done

# why tests were skipped, one line per reason over every part, from -rs's 'SKIPPED [3] tests/x.py:12: reason'
if [ -s "$LOGS/skips" ]; then
  say "skipped, by reason (every part)"
  sed -E 's/^SKIPPED \[([0-9]+)\] [^ ]*: /\1\t/' "$LOGS/skips" \
    | awk -F '\t' '{ count[$2] += $1 } END { for (reason in count) printf "  %5d  %s\n", count[reason], reason }' \
    | sort -rn
fi
say "summary"
printf '  %s\n' "${SUMMARY[@]}"
# the closing line, as pytest writes it: every part's counts added up, warnings included
"$PY" - "$LOGS/counts" $((SECONDS - START)) <<'PY'
import re, sys
totals = {}
for line in open(sys.argv[1]):
    for count, kind in re.findall(r"(\d+) (passed|failed|skipped|deselected|xfailed|xpassed|warning|error)s?\b", line):
        totals[kind] = totals.get(kind, 0) + int(count)
order = ["failed", "passed", "skipped", "deselected", "xfailed", "xpassed", "warning", "error"]  # pytest's order
plural = {"warning": "warnings", "error": "errors"}  # pytest writes "1 warning", "2 warnings"
parts = [f"{totals[k]} {plural.get(k, k) if totals[k] > 1 else k}" for k in order if totals.get(k)]
print(f"======== {', '.join(parts) or 'no tests ran'} in {float(sys.argv[2]):.2f}s ========")
PY
exit $FAILED
