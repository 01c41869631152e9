"""The launch path against the installed Triton's own launcher, without a GPU (launch_offline.py): a kind
launches by its launcher's own C function, learned without touching the launcher; a plan passes it exactly
what Triton's launch passes, in the format Triton's C launcher parses; another weight of a kind gets exactly
Triton's arguments for that weight with no launch by Triton; the key tells apart every pair of weights that
Triton compiles apart; a plan steps aside for a launch hook (enter or exit), a changed or deleted field, a
swapped storage and another current GPU, and passes the current stream; each case the launch path's header
names takes the launches it says; a weight called as W.t() and held gets out.t() each call; a plan leaves a
W that is no tensor to validation; a quant state no weak reference can watch (a SimpleNamespace) gets
Triton's bits, bitsandbytes' old list format an error naming it; an error a direct launch raises reaches the
caller; a kind keeps its compiled kernel alive; two threads' first calls of one kind at once leave Triton
as it was."""
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
def test_a_plan_launches_what_triton_launches(report, layout):
    case = report[layout]
    assert case["problems"] == [], f"Triton {report['triton']}: {case['problems']}"
    assert case["first_call_matches_triton"]
    assert case["kind"] and case["fast"], f"Triton {report['triton']}: no plan"
    assert case["fast_matches_triton"]


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_a_kind_launches_by_the_launchers_own_c_function(report, layout):
    # compiled.run's Python is out of the way on every Triton it runs on, and the copy that learned its
    # values left compiled.run as it was and launched nothing
    case = report[layout]
    assert case["c_launch"], f"Triton {report['triton']}: the kind launches through compiled.run"
    assert case["launcher_unchanged"]


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_another_weight_of_the_kind_is_planned_without_triton(report, layout):
    case = report[layout]
    assert case["same_key"]
    assert case["second_weight_launches"] == [0, 1]  # (Triton's launches, direct launches)
    assert case["second_weight_fast"] and case["second_weight_matches_triton"]


@pytest.mark.parametrize("which", ["enter", "exit"])
@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_a_hook_set_after_the_first_call_is_honoured(report, layout, which):
    assert report[layout][f"fast_with_an_{which}_hook_set_later"] is False


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_a_field_deleted_after_the_first_call_is_left_to_validation(report, layout):
    assert report[layout]["fast_with_a_field_deleted"] is False


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_a_plan_sees_every_field_changed(report, layout):
    assert report[layout]["fields_unseen_when_changed"] == []


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_a_plan_sees_every_storage_swapped_in_place(report, layout):
    # `t.data = other` keeps the object and moves its bytes: a plan must not launch on the old ones
    assert report[layout]["storage_swaps_unseen"] == []


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_a_plan_steps_aside_while_another_gpu_is_current(report, layout):
    assert report[layout]["other_gpu_current"] is False


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_a_direct_launch_runs_on_the_current_stream(report, layout):
    stream = report[layout]["stream"]
    assert stream["passed"] == [stream["expected"]] and stream["matches_triton"]


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_a_plan_takes_the_transposed_view_of_its_weight(report, layout):
    assert report[layout]["transposed_view_matches_triton"]


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_a_plan_declines_another_view_of_its_bytes(report, layout):
    assert report[layout]["other_view_declined"]


@pytest.mark.parametrize("layout", ["nested", "plain"])
def test_a_plan_leaves_a_w_that_is_no_tensor_to_validation(report, layout):
    assert report[layout]["not_a_tensor_declined"] is True


def test_a_weight_called_as_w_t_and_held_gets_out_t_on_every_call(report):
    # the first call validated (a new kind: Triton's launch), the second by the plan made for W.t() itself
    case = report["held_transposed"]
    assert case["launches"] == [[1, 0], [0, 1]] and case["shapes"] == [[256, 40], [256, 40]]
    assert case["matches_triton"]


def test_each_case_the_header_names_takes_the_launches_it_says(report):
    # (Triton's launches, direct launches) per call, as the launch path's header says for each case
    paths = report["paths"]
    assert paths["a new kind"] == [[1, 0]]
    assert paths["a plan that holds"] == [[0, 1], [0, 1]]
    assert paths["a weight with no plan"] == [[0, 1], True]  # its plan kept
    assert paths["a plan that declined (a new kind)"] == [[1, 0], [0, 1]]
    assert paths["a quant state without weak references"] == [[0, 1], [0, 1], False]
    assert paths["an offset converted for the call"] == [[0, 1], [0, 1], False]
    for case in ("NF4_FAST_LAUNCH=0", "torch.compile", "a launch hook set"):
        assert paths[case] == [[1, 0], [1, 0]], case
    assert paths["after all that, the plan"] == [[0, 1]]


def test_nothing_is_learned_while_a_launch_hook_is_set(report):
    case = report["with_launch_hook"]
    assert case == {"triton_launches": 1, "kind": False, "output": [64, 256], "fast": False}


def test_a_kind_first_seen_without_a_plan_launches_directly_after(report):
    # the first weight's fp16 offset is converted (this call's alone): no plan for it, but its later calls
    # launch directly, and a weight of the same kind is planned
    case = report["converted_offset_first"]
    assert case["launches"] == [[1, 0], [0, 1]] and case["kind"] and not case["fast"]
    assert case["same_key"] and case["other_weight_launches"] == [[0, 1]] and case["other_weight_fast"]


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


def test_a_quant_state_without_weak_references_gets_tritons_bits(report):
    # nothing can watch it, so no plan: each call is validated, then launched directly, nothing raised or warned
    case = report["other_quant_states"]["SimpleNamespace"]
    assert case == {"matches_triton": True, "later_call_launches": 1, "warnings": [], "plan": False}


def test_a_quantstate_whose_state2_is_a_simplenamespace_is_planned(report):
    case = report["other_quant_states"]["QuantState, state2 a SimpleNamespace"]
    assert case == {"matches_triton": True, "later_call_launches": 1, "warnings": [], "plan": True}


@pytest.mark.parametrize("form", ["list, state2 an object", "list, state2 a list", "list, plain absmax"])
def test_bitsandbytes_list_format_is_refused_naming_it_and_what_to_pass(report, form):
    message = report["other_quant_states"][form]
    assert message.startswith("dequantize_nf4: quant_state is a list, bitsandbytes' format before 0.41.2")
    assert "[absmax, shape, dtype, blocksize, [offset, state2], quant_type, code]" in message
    assert "pass a QuantState" in message


def test_an_error_a_direct_launch_raises_reaches_the_caller(report):
    # as Triton's own launch's would (a sticky CUDA error): nothing warned or given up, and the weight's
    # later calls launch directly again, with Triton's bits
    case = report["direct_launch_raises"]
    assert case["error"] == "CUDA error: an illegal memory access was encountered"
    assert case["warnings"] == [] and case["planned"]
    assert case["launches"] == [1, 1] and case["matches_triton"]


def test_a_kind_keeps_its_compiled_kernel_alive(report):
    # Triton 3.9 unloads a compiled kernel's module when the object dies: the function a plan launches
    # must outlive Triton's own cache of it
    assert report["compiled_kernel_lifetime"] == {"alive": True, "matches_triton": True}


def test_two_threads_first_calls_of_one_kind_at_once(report):
    case = report["two_threads_first_call"]
    assert case == {"interleaved": True, "kind": True, "launcher_unchanged": True, "outputs": ["first", "second"]}


def test_t4_codes_sm75_launch_passes_what_triton_passes(report):
    # the sm_75 timing's launches (benchmarks/t4_code.py) call the JIT build's launcher as the plans do
    case = report["t4_code"]
    assert case == {"target": 75, "matches_triton": True, "problems": []}, f"Triton {report['triton']}: {case}"
