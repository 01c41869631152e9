"""The launch path against the installed Triton's own launcher, without a GPU (launch_offline.py): a
plan replays exactly what Triton passes, in the format Triton's C launcher parses; a template recorded
from one weight gives another weight of its key exactly Triton's arguments for that weight, with no
launch by Triton; the key tells apart every pair of weights that Triton compiles apart; and the path
steps aside whenever a launch hook is set, before or after its first call; a quant state no weak
reference can watch (a SimpleNamespace) gets Triton's bits, bitsandbytes' old list format an error naming
it; a replay whose C launch raises gives way to Triton's launch, for good for its kind, and an error
Triton raises too reaches the caller."""
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
    assert case["template"] and case["fast"], f"Triton {report['triton']}: the fast launch declined"
    assert case["fast_matches_triton"]
    assert case["recorded_launch_unchanged"], "the launch that was recorded passed something else"
    assert case["triton_launches_on_a_new_key"] == 2  # its own, then recorded


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_another_weight_of_the_key_is_planned_without_triton(report, layout):
    case = report[layout]
    assert case["same_key"]
    assert case["second_weight_triton_launches"] == 0
    assert case["second_weight_fast"] and case["second_weight_matches_triton"]


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_a_hook_set_after_the_first_call_is_honoured(report, layout):
    assert report[layout]["fast_with_a_hook_set_later"] is False


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_a_field_deleted_after_the_first_call_is_left_to_triton(report, layout):
    assert report[layout]["fast_with_a_field_deleted"] is False


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_a_plan_sees_every_field_replaced_by_an_equal_object(report, layout):
    assert report[layout]["fields_unseen_when_replaced"] == []


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_a_plan_takes_the_transposed_view_of_its_weight(report, layout):
    assert report[layout]["transposed_view_matches_triton"]


def test_nothing_is_learned_while_a_launch_hook_is_set(report):
    case = report["with_launch_hook"]
    assert case == {"triton_launches": 1, "template": False, "output": [64, 256], "fast": False}


def test_a_key_first_seen_without_a_plan_is_recorded_once(report):
    # the first weight's fp16 offset is converted (this call's alone): no plan for it, but its later
    # calls are not recorded again, and a weight of the same key is planned from the recording
    case = report["converted_offset_first"]
    assert case["first_call_launches"] == 3 and case["template"] and not case["fast"]
    assert case["later_call_launches"] == 1
    assert case["same_key"] and case["other_weight_launches"] == 1 and case["other_weight_fast"]


def test_the_key_tells_apart_what_triton_compiles_apart(report):
    sweep = report["sweep"]
    assert sweep["keys_with_two_kernels"] == 0, f"Triton {report['triton']}: one key, two compiled kernels"
    assert sweep["kernels"] > 1 and sweep["keys"] >= sweep["kernels"]


def test_every_plan_in_the_sweep_passes_what_triton_passes(report):
    rows = report["sweep"]["rows"]
    assert all(row["matches_triton"] for row in rows.values())
    assert all(row["fast_matches_triton"] for row in rows.values() if row["fast"])
    # only the converted fp64 offset (a temporary tensor, this call's alone) has no plan
    assert [name for name, row in rows.items() if not row["fast"]] == ["fp64 offset"]


@pytest.mark.parametrize("form", ["SimpleNamespace", "QuantState, state2 a SimpleNamespace"])
def test_a_quant_state_without_weak_references_gets_tritons_bits(report, form):
    # nothing can watch it, so no plan: each call is validated, then launched (a later call by the
    # kind's template, one C launch), and nothing is raised or warned
    case = report["other_quant_states"][form]
    assert case == {"matches_triton": True, "later_call_launches": 1, "warnings": [], "plan": False}


@pytest.mark.parametrize("form", ["list, state2 an object", "list, state2 a list", "list, plain absmax"])
def test_bitsandbytes_list_format_is_refused_naming_it_and_what_to_pass(report, form):
    message = report["other_quant_states"][form]
    assert message.startswith("dequantize_nf4: quant_state is a list, bitsandbytes' format before 0.41.2")
    assert "[absmax, shape, dtype, blocksize, [offset, state2], quant_type, code]" in message
    assert "pass a QuantState" in message


def test_a_replay_that_raises_gives_way_to_triton_for_its_kind(report):
    case = report["replay_raises"]
    assert case["same_key"]  # A and B are one kind, C another
    assert case["A"]["planned"] and case["B"]["planned"] and case["C"]["planned"]
    a = case["A"]
    assert a["matches_triton"] and a["launches"] == [1, 1] and not a["planned_after"]
    assert a["warnings"] == ["dequantize_nf4: a replayed launch raised TypeError: function takes exactly 18 "
                             "arguments (17 given); this kind of weight now launches through Triton"]
    assert case["B"]["matches_triton"] and case["B"]["warnings"] == [] and not case["B"]["planned_after"]
    # nothing else changes: the other kind still replays, its plan kept
    assert case["C"]["launches"] == [1, 1] and case["C"]["warnings"] == [] and case["C"]["planned_after"]


def test_a_template_whose_check_replay_raises_is_not_kept(report):
    case = report["replay_raises"]["D"]
    assert case["matches_triton"] and len(case["warnings"]) == 1
    assert not case["template"] and not case["planned"]


def test_an_error_tritons_launch_raises_too_reaches_the_caller(report):
    assert report["replay_raises"]["E"] == "CUDA error: an illegal memory access was encountered"


def test_t4_codes_sm75_launch_passes_what_triton_passes(report):
    # the sm_75 timing's launches (benchmarks/t4_code.py) come from the paste unit's own recorder
    case = report["t4_code"]
    assert case == {"target": 75, "matches_triton": True, "problems": []}, f"Triton {report['triton']}: {case}"
