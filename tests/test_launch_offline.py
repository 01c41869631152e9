"""The launch path against the installed Triton's own launcher, without a GPU (launch_offline.py): a
plan replays exactly what Triton passes, in the format Triton's C launcher parses, records without
launching twice, and steps aside whenever a launch hook is set, before or after its first call."""
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
def test_fast_launch_passes_what_triton_passes(report, layout):
    case = report[layout]
    assert case["problems"] == [], f"Triton {report['triton']}: {case['problems']}"
    assert case["fast"], f"Triton {report['triton']}: the fast launch declined"
    assert case["fast_matches_triton"]
    assert case["recorded_launch_unchanged"], "the launch that was recorded passed something else"


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_a_hook_set_after_the_first_call_is_honoured(report, layout):
    assert report[layout]["fast_with_a_hook_set_later"] is False


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_a_field_deleted_after_the_first_call_is_left_to_triton(report, layout):
    assert report[layout]["fast_with_a_field_deleted"] is False


def test_nothing_is_learned_while_a_launch_hook_is_set(report):
    case = report["with_launch_hook"]
    assert not case["fast"] and case["problems"] == []
