"""The launch path against the installed Triton's own JIT and launcher, without a GPU (launch_offline.py, two stand-in
GPUs): every call passes exactly what Triton's own launch of the freshly validated state passes, in the format
Triton's C launcher parses; each case the launch path's header names takes the launches it says; each per-launch
state this Triton has (launch hooks, debug mode, an instrumentation mode, a pre-run hook) sends calls to Triton's
launch while set; the launch cell run again at any step of a first call changes neither its bits nor the plans'
bound; a weight whose GPU is not current launches on its own GPU and stream; every field, storage swap and in-place
change of W changes the key; the kind key tells apart what Triton compiles apart; quant states that are not a
QuantState get Triton's arguments, bitsandbytes' old list format an error naming it; an error a launch raises
reaches the caller; a plan keeps its compiled kernel alive; two threads' first calls of one kind at once make one
kind, and two threads keeping plans at once keep no more than the bound."""
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
def test_each_call_launches_what_triton_launches(report, layout):
    case = report[layout]
    assert case["problems"] == [], f"Triton {report['triton']}: {case['problems']}"
    # (Triton's launches, direct launches): a new kind's first call is Triton's, then its plan's
    expected = {"first call": [1, 0], "plan": [0, 1], "W.t(), first": [0, 1], "W.t(), plan": [0, 1]}
    for name, launches in expected.items():
        assert case[name]["launches"] == launches and case[name]["matches_triton"], (name, case[name])
    assert case["W.t(), plan"]["shape"] == case["plan"]["shape"][::-1]
    assert case["another weight of the kind"] == {"launches": [0, 1], "matches_triton": True}


def test_each_case_the_header_names_takes_the_launches_it_says(report):
    # (Triton's launches, direct launches) per call, as the launch path's header says for each case
    paths = report["paths"]
    assert paths["a new kind"] == [[1, 0]]
    assert paths["a plan that holds"] == [[0, 1], [0, 1]]
    assert paths["a new key of a known kind"] == [[0, 1], True]  # validated, then the kind's kernel; plan kept
    assert paths["a new key of a new kind"] == [[1, 0], [0, 1]]
    assert paths["a SimpleNamespace quant state"] == [[0, 1], [0, 1], True]
    assert paths["a table decoded in CUDA-graph capture"] == [[0, 1], [0, 1], False]  # no plan: each call validated
    for case in ("NF4_FAST_LAUNCH=0", "torch.compile", "a launch enter hook", "a launch exit hook", "debug mode",
                 "a pre-run hook", "the kernel's own debug flag", "a compile hook", "a post-compile hook"):
        assert paths[case] == [[1, 0], [1, 0]], case
    assert paths["CONFIG_OVERRIDE set"] == [[1, 0], [0, 1]]  # another configuration: another kind, then its plan
    assert paths["LAUNCH_CONFIGS changed"] == [[1, 0], [0, 1]]  # (so is a LAUNCH_CONFIGS entry changed in place)
    assert paths["the kernel cell run again"] == [[1, 0], [0, 1]]  # another JITFunction: its own kinds and plans
    # Triton's launch with a compile hook that skips compiling launches nothing, and so does ours; nothing kept
    assert paths["a compile hook that skips compiling"] == {"while skipping": [[1, 0], [1, 0]],  # (C launches: none)
                                                           "launches after": [[1, 0], [0, 1]], "matches_triton": True}
    assert paths["after all that, the plan"] == [[0, 1]]


def test_every_per_launch_state_of_this_triton_sends_calls_to_tritons_launch(report):
    # set after a plan exists: Triton's launch, with Triton's arguments (its hooks called); cleared: the plan
    states = report["triton_state"]
    names = {"a launch enter hook", "a launch exit hook", "debug mode", "a pre-run hook", "the kernel's own debug flag",
             "a compile hook", "a post-compile hook", "a compile hook that reads as False",
             "a post-compile hook that reads as False",
             "a launch enter hook that reads as False", "a launch exit hook that reads as False"}
    version = tuple(int(part) for part in report["triton"].split(".")[:2])
    if version >= (3, 6):
        names.add("an instrumentation mode")
    if version >= (3, 7):
        names.add("a stages inspection hook")
    assert names <= set(states), sorted(states)
    for name in names:
        assert states[name] == {"launches": [1, 0], "matches_triton": True, "after": [0, 1]}, (name, states[name])
    assert states["hook calls"] > 0


def test_validation_s_constants_assigned_from_another_cell_change_nothing_until_the_wrapper_cell_runs(report):
    # validation took BLOCKSIZES and MIN_CAPABILITY as the wrapper cell ran: assigned after a plan exists (a value
    # it would refuse, a list changed in place, one holding a list, a tensor), the plan answers every call with
    # Triton's launch, reading nothing; the wrapper cell run again with the blocksize left out refuses it by name
    constants = dict(report["constants"])
    rerun = constants.pop("the wrapper cell run again, its BLOCKSIZES without the blocksize")
    assert rerun == "refused: dequantize_nf4: blocksize 64 is not one of bitsandbytes' (32, 128, 256, 512, 1024, " \
                    "2048, 4096)", rerun
    assert len(constants) == 6
    for name, calls in constants.items():
        assert calls == [[False, True]] * len(calls) and len(calls) >= 2, (name, calls)


def test_a_cell_run_again_during_a_first_call_leaves_no_plan_answering_for_the_new_cells(report):
    # the plan a first call keeps holds the kernel and checks that call began with: a wrapper cell run again with
    # the weight's blocksize left out refuses the next call by name, and a kernel cell run again (edited) launches
    # its own kernel by Triton's launch (a new kind); the plan the first call kept holds the build of the kernel it
    # is stamped with (a new kind's, compiled during the call)
    wrapper, kernel_cell = (report["a_cell_run_again_during_a_first_call"][name]
                            for name in ("the wrapper cell", "the kernel cell"))
    assert wrapper["the next call"].startswith("refused: dequantize_nf4: blocksize 64 is not one of"), wrapper
    assert wrapper["the plan holds its kernel's build"] is True, wrapper
    assert kernel_cell == {"a new kind": True, "the plan holds its kernel's build": True,
                           "the next call": [[1, 0], True]}, kernel_cell


def test_a_first_call_anywhere_in_a_wrapper_cell_run_leaves_no_plan_the_finished_cell_would_not_make(report):
    # a plan is stamped with validate, so validate is defined after everything a plan's launch depends on
    # (device_capability, launch_config, launch_arguments, kind_key, launcher_arguments, launch_setup): a first call
    # that took the new validate took them new too
    assert report["a_first_call_at_each_step"] == []


def test_the_launch_cell_run_again_at_any_step_of_a_first_call_changes_no_bits_nor_the_bound(report):
    # the launch cell run again makes new kinds and plans: a first call in flight reads each once, so at every step,
    # with another thread's first call of another kind and PLANS_KEPT lowered to 1 between, both calls launch what
    # Triton launches, the plans kept stay within the bound, and both weights' next calls launch as Triton does
    # (the call keeping its plan in the kinds and plans it read: the old ones, lost); a known kind's call and a new
    # kind's, each step from the cell run afresh
    steps = report["the_launch_cell_at_each_step"]
    assert steps["wrong"] == [], steps["wrong"]
    assert steps["steps"]["a known kind"] >= 100 and steps["steps"]["a new kind"] >= 100, steps["steps"]


@pytest.mark.parametrize("case", ["on GPU 1, GPU 0 current", "on GPU 0, GPU 1 current"])
def test_a_weight_on_the_gpu_that_is_not_current_launches_on_its_own(report, case):
    # a model split over two GPUs: the first call (Triton's) and the plan's launch with the weight's GPU current
    # and that GPU's stream, and leave the current GPU as it was
    gpu, current = int(case[7]), int(case[14])
    first, plan = report["another_gpu"][case]
    for row in (first, plan):
        assert row["gpus"] == [gpu] and row["streams"] == [0x5EED + gpu], row
        assert row["current_after"] == current and row["matches_triton"], row
    assert first["launches"] == [1, 0] and plan["launches"] == [0, 1]


def test_a_quant_state_tensor_on_another_gpu_than_w_is_refused_by_name(report):
    answer = report["a_tensor_on_the_other_gpu"]  # (validation's error, or "returned")
    assert answer.startswith("dequantize_nf4: W is on ") and "but quant_state.absmax is on" in answer, answer


def test_every_change_a_launch_depends_on_changes_the_key(report):
    # each field set to another value or deleted, each tensor's storage swapped or reinterpreted at its address
    # (another dtype, fewer values, stride 0), W.t_(), a list shape: a plan must never answer them
    assert report["key_changes"] == []


def test_the_key_tells_apart_what_triton_compiles_apart(report):
    sweep = report["sweep"]
    assert sweep["keys_with_two_kernels"] == 0, f"Triton {report['triton']}: one key, two compiled kernels"
    assert sweep["kernels"] > 1 and sweep["keys"] >= sweep["kernels"]
    for name, row in sweep["rows"].items():
        assert row["matches_triton"] and row["launches"][1] == [0, 1], (name, row)
        assert row["planned"], (name, row)


@pytest.mark.parametrize("form", ["SimpleNamespace", "QuantState, state2 a SimpleNamespace"])
def test_a_quant_state_that_is_not_a_quantstate_gets_tritons_arguments_and_a_plan(report, form):
    case = report["other_quant_states"][form]
    assert case["matches_triton"] and case["warnings"] == [] and case["launches"][1] == [0, 1], case


@pytest.mark.parametrize("form", ["list, state2 an object", "list, state2 a list", "list, plain absmax"])
def test_bitsandbytes_list_format_is_refused_naming_the_list(report, form):
    message = report["other_quant_states"][form]
    assert message == "dequantize_nf4: quant_state.absmax is missing (a list has none)"


def test_an_error_a_launch_raises_reaches_the_caller(report):
    # as Triton's own launch's would (a sticky CUDA error): nothing warned or given up, and the weight's later
    # calls take its plan again, with Triton's arguments
    case = report["a_launch_raises"]
    assert case == {"error": "CUDA error: an illegal memory access was encountered", "warnings": [],
                    "launches": [[0, 1], [0, 1]], "matches_triton": True}


def test_a_weight_called_as_w_t_and_held_gets_out_t_on_every_call(report):
    case = report["held_transposed"]
    assert case == {"launches": [[1, 0], [0, 1]], "shapes": [[256, 40], [256, 40]], "matches_triton": True}


def test_a_plan_keeps_its_compiled_kernel_alive(report):
    # Triton 3.9 unloads a compiled kernel's module when the object dies: the function a plan launches must
    # outlive Triton's own cache of it
    assert report["compiled_kernel_lifetime"] == {"alive": True, "launches": [0, 1], "matches_triton": True}


def test_two_threads_first_calls_of_one_kind_at_once(report):
    case = report["two_threads_first_call"]
    assert case == {"interleaved": True, "new_kinds": 1, "outputs": ["first", "second"],
                    "later_calls_match_triton": True}


def test_two_threads_keeping_plans_at_once_stay_within_the_bound(report):
    # both threads read the plans' size before either keeps its plan where keeping is not locked
    assert report["two_threads_keep_at_the_bound"] == {"kept": 1, "bound": 1, "outputs": ["first", "second"]}


def test_t4_codes_sm75_launch_passes_what_triton_passes(report):
    # the sm_75 timing's launches (benchmarks/t4_code.py) call the JIT build's launcher as the plans do
    case = report["t4_code"]
    assert case == {"target": 75, "matches_triton": True, "problems": []}, f"Triton {report['triton']}: {case}"
