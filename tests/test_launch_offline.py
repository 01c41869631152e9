"""The direct launch against the installed Triton's own launcher, without a GPU (launch_offline.py):
it replays exactly what Triton passes, in the format Triton's C launcher parses, and declines where
a launch hook is set."""
import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def report():
    script = Path(__file__).with_name("launch_offline.py")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_replay_passes_what_triton_passes(report, layout):
    case = report[layout]
    assert case["problems"] == [], f"Triton {report['triton']}: {case['problems']}"
    assert case["replay"], f"Triton {report['triton']}: the direct launch declined"
    assert case["replay_matches_triton"]


def test_declines_while_a_launch_hook_is_set(report):
    case = report["with_launch_hook"]
    assert not case["replay"] and case["problems"] == []
