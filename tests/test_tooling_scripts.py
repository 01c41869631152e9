"""scripts/test.sh and scripts/venv.sh, run as a newcomer runs them, on stand-ins: test.sh's closing line adds up
every part's pytest summary, warnings included (its adder on parts' lines; test.sh --no-install on a small suite
of its own), and a Triton venv's messages say a download only where pip downloads (pip stands in, answering from its
cache or from PyPI)."""
import os
import re
import shutil
import stat
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPTS = ("test.sh", "venv.sh")  # what test.sh runs besides pytest

# A small suite: one test passes and warns twice, one is skipped.
PASSES_AND_WARNS = """
import warnings

import pytest


def test_passes_and_warns():
    warnings.warn("the first warning")
    warnings.warn("the second warning")


def test_skipped():
    pytest.skip("a reason")
"""
# A small suite that warns as it is collected, then fails to import: pytest's summary opens with the warning.
WARNS_THEN_BREAKS = """
import warnings

warnings.warn("a warning while collecting")
raise ImportError("a module that cannot be imported")
"""


def executable(path, text):
    """Writes `text` to `path`, executable; returns the path."""
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def closing_line(tmp_path, summaries, seconds="9.5"):
    """What test.sh's adder (the Python it runs between <<'PY' and PY) prints for `summaries`, a part's line each."""
    adder = (ROOT / "scripts" / "test.sh").read_text().split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    counts = tmp_path / "counts"
    counts.write_text("".join(summary + "\n" for summary in summaries))
    printed = subprocess.run([sys.executable, "-", str(counts), seconds], input=adder, capture_output=True,
                             text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    return printed.stdout.strip()


def test_the_closing_line_adds_up_every_part_warnings_included(tmp_path):
    parts = ["3 passed, 2 skipped, 1 warning in 1.00s",
             "1 failed, 5 passed, 12 warnings in 2.00s",
             "1 error (no venv)"]
    added_up = "======== 1 failed, 8 passed, 2 skipped, 13 warnings, 1 error in 9.50s ========"
    assert closing_line(tmp_path, parts) == added_up
    assert closing_line(tmp_path, ["1 warning, 2 errors in 0.30s"]) == "======== 1 warning, 2 errors in 9.50s ========"
    assert closing_line(tmp_path, ["4 passed in 0.10s"]) == "======== 4 passed in 9.50s ========"
    assert closing_line(tmp_path, []) == "======== no tests ran in 9.50s ========"


@pytest.mark.parametrize("suite, counts, status", [(PASSES_AND_WARNS, "1 passed, 1 skipped, 2 warnings", 0),
                                                   (WARNS_THEN_BREAKS, "1 warning, 1 error", 1)],
                         ids=["passes and warns", "warns then breaks"])
def test_test_sh_ends_with_every_count_pytest_gave_warnings_included(tmp_path, suite, counts, status):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in SCRIPTS:
        shutil.copy2(ROOT / "scripts" / name, repo / "scripts" / name)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_small.py").write_text(suite)
    bin_folder = tmp_path / "bin"  # --no-install runs the python3 on PATH: this interpreter
    bin_folder.mkdir()
    executable(bin_folder / "python3", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    env = dict(os.environ, PATH=f"{bin_folder}{os.pathsep}{os.environ['PATH']}")
    ran = subprocess.run(["bash", str(repo / "scripts" / "test.sh"), "--no-install"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == status, ran.stdout + ran.stderr
    said = ran.stdout.splitlines()
    assert re.fullmatch(rf"  main suite +triton \S+ +{counts} in [0-9.]+s", said[-2]), said[-2]  # the part's
    assert re.fullmatch(rf"======== {counts} in [0-9.]+s ========", said[-1]), said[-1]  # the closing line


# pip as it answers `-m pip --python VENV_PYTHON install --no-deps triton==9.9.9` where the wheel is in its cache, or
# where it downloads it; it installs a stand-in triton 9.9.9 into VENV_PYTHON's site-packages. Everything else: .venv's
# python.
STAND_IN_PYTHON = """#!/usr/bin/env bash
if [ "$1 $2" = "-m pip" ]; then
  site=$("$4" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$site/triton" && echo '__version__ = "9.9.9"' > "$site/triton/__init__.py"
  echo "Collecting triton==9.9.9"
  echo "  {answer}"
  echo "Installing collected packages: triton"
  echo "Successfully installed triton-9.9.9"
  exit 0
fi
exec "{python}" "$@"
"""
WHEEL = "triton-9.9.9-cp311-cp311-manylinux_2_27_x86_64.whl (170.0 MB)"


@pytest.mark.parametrize("answer", [f"Using cached {WHEEL}", f"Downloading {WHEEL}"], ids=["cached", "downloaded"])
def test_a_triton_venv_says_a_download_only_where_pip_downloads(tmp_path, answer):
    python = executable(tmp_path / "python", STAND_IN_PYTHON.format(answer=answer, python=sys.executable))
    made = subprocess.run(["bash", "-c", f'SCRIPT=test.sh; source "{ROOT}/scripts/venv.sh"; triton_venv "$0" 9.9.9',
                           str(python)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout + made.stderr
    assert (tmp_path / ".venv-triton-9.9.9" / "bin" / "python").exists()
    said = [line.strip() for line in made.stdout.splitlines()]
    assert "triton 9.9.9: creating .venv-triton-9.9.9" in said[0]
    assert answer in said[1:], "pip's own line says where the wheel came from"
    if answer.startswith("Using cached"):
        assert "download" not in made.stdout.lower(), made.stdout
