"""The launch configuration picked where it runs (timing.pick_launch_config, issue 42).

CPU: which GPUs re-pick (CONFIG_MEASURED_ON, held to the paste unit's comment on LAUNCH_CONFIGS), the
candidates, the winner rule with fake timings and exactness, the one-line text, nothing timed without a GPU,
and in the interpreter that the launches take the winner. GPU (marked): a real pick with this GPU answering as a
T4 through the kernel module's device_capability, and a weight planned before a pick launching the new one.
"""
import json
import os
import re
import tempfile

import pytest
import torch

import helpers
import timing
from benchmarks import cells as kernel_cells

T4 = (7, 5)
PICK_KEYS = {"what", "gpu", "capability", "picked", "table_entry", "replaced", "winner", "entry_slower", "weights",
             "candidates", "cost"}
CANDIDATE_KEYS = {"config", "label", "exact", "gpu_us", "total_us"}
COST_KEYS = {"builds_at_most", "checked_launches", "timed_launches", "profiler_sessions", "check_s", "timing_s"}


# ---------------------------------------------------------------------------------------------
# CPU: which GPUs pick, and what
# ---------------------------------------------------------------------------------------------
def _entry_comments() -> dict:
    """capability -> the comment beside its LAUNCH_CONFIGS entry in the paste unit's source."""
    source = "\n\n".join(kernel_cells.kernel_cell_sources())
    table = re.search(r"^LAUNCH_CONFIGS = \{\n(.*?)^\}", source, re.MULTILINE | re.DOTALL).group(1)
    comments = {}
    for line in table.splitlines():
        entry = re.match(r"\s*\((\d+), (\d+)\): LaunchConfig\(.*\),\s*#(.*)$", line)
        assert entry, f"a LAUNCH_CONFIGS line without its comment: {line!r}"
        comments[(int(entry.group(1)), int(entry.group(2)))] = entry.group(3)
    return comments


def test_config_measured_on_names_the_folders_of_the_paste_units_comment(kernel):
    comments = _entry_comments()
    assert set(comments) == set(kernel.LAUNCH_CONFIGS) == set(timing.CONFIG_MEASURED_ON)
    folders = [path.name for path in (helpers.ROOT / "results").iterdir() if path.is_dir()]
    for capability, comment in comments.items():
        named = {name for name in folders if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", comment)}
        tabled = {helpers.gpu_slug(model) for model in timing.CONFIG_MEASURED_ON[capability]}
        assert named == tabled, f"{capability}: the comment names {named}, CONFIG_MEASURED_ON {tabled}"


@pytest.mark.parametrize("gpu_name, capability, measured", [
    ("NVIDIA H100 80GB HBM3", (9, 0), True),
    ("NVIDIA H200", (9, 0), True),
    ("NVIDIA H100 PCIe", (9, 0), False),  # another model of the same capability
    ("Quadro RTX 6000", (7, 5), False),   # its entry: sm_75 builds timed on Hopper (a T4's pick, once adopted,
                                          # adds the T4 to CONFIG_MEASURED_ON, never another Turing card)
    ("NVIDIA A100-SXM4-40GB", (8, 0), False),  # DEFAULT_CONFIG
    ("NVIDIA L4", (8, 9), False),
])
def test_what_is_picked_again(kernel, gpu_name, capability, measured):
    assert timing.config_measured_here(capability, gpu_name, kernel.LAUNCH_CONFIGS) is measured


@pytest.mark.parametrize("capability", [T4, (8, 0), (8, 9), (9, 0)])
def test_the_candidates_hold_the_table_entry_first(kernel, capability):
    candidates = timing.launch_candidates(vars(kernel), capability)
    entry = kernel.LAUNCH_CONFIGS.get(capability, kernel.DEFAULT_CONFIG)
    assert candidates[0] == entry
    assert 4 <= len(candidates) <= 6 and len(set(candidates)) == len(candidates)
    assert all(isinstance(config, kernel.LaunchConfig) for config in candidates)


def test_a_t4s_candidates_are_the_ones_checked_as_sm_75_builds(kernel):
    from benchmarks import t4_code
    assert set(timing.launch_candidates(vars(kernel), T4)) == set(t4_code.t4_configs(kernel))


# ---------------------------------------------------------------------------------------------
# CPU: the winner rule, with fake measurements
# ---------------------------------------------------------------------------------------------
def _fake_gpu(monkeypatch, gpu_name, capability, totals=None, exact=None):
    """this_gpu answers (gpu_name, capability); measure_candidates gives candidate i total GPU time totals[i]
    (three equal weights) and exactness exact[i]; pick_layers builds nothing. Returns the measured calls."""
    measured = []

    def measure(cells, candidates, capability, layers, rounds, calls):
        measured.append(list(candidates))
        results = []
        for index, config in enumerate(candidates):
            ok = exact is None or exact[index]
            gpu_us = [totals[index] / 3] * 3 if ok else None
            results.append({"config": list(config), "label": timing.describe_config(config), "exact": [ok] * 3,
                            "gpu_us": gpu_us, "total_us": sum(gpu_us) if ok else None})
        return results, {"check_s": 1.0, "timing_s": 1.0}

    monkeypatch.setattr(timing, "this_gpu", lambda cells: (gpu_name, capability))
    monkeypatch.setattr(timing, "pick_layers", lambda: [])
    monkeypatch.setattr(timing, "measure_candidates", measure)
    return measured


def test_the_fastest_exact_candidate_wins_and_an_inexact_one_is_out(kernel, monkeypatch):
    measured = _fake_gpu(monkeypatch, "Quadro RTX 6000", T4, totals=[100, 80, 90, 95, 100, 120],
                         exact=[True, False, True, True, True, True])
    cells = dict(vars(kernel))
    pick = timing.pick_launch_config(cells, True)
    candidates = timing.launch_candidates(cells, T4)
    assert measured == [candidates]
    assert pick["picked"] and pick["winner"] == list(candidates[2]) and pick["replaced"] == list(candidates[0])
    assert cells["CONFIG_OVERRIDE"] == candidates[2]
    assert pick["entry_slower"] == pytest.approx(100 / 90 - 1)
    assert set(pick) == PICK_KEYS and pick["gpu"] == "Quadro RTX 6000" and pick["capability"] == [7, 5]
    assert pick["table_entry"] == "LAUNCH_CONFIGS[(7, 5)]"
    json.dumps(pick)  # notebook.json holds it


def test_a_tie_goes_to_the_table_entry(kernel, monkeypatch):
    _fake_gpu(monkeypatch, "NVIDIA A100-SXM4-40GB", (8, 0), totals=[90, 90, 95, 90, 100, 120])
    cells = dict(vars(kernel))
    pick = timing.pick_launch_config(cells, True)
    assert pick["table_entry"] == "DEFAULT_CONFIG" and pick["winner"] == list(kernel.DEFAULT_CONFIG)
    assert cells["CONFIG_OVERRIDE"] == kernel.DEFAULT_CONFIG and pick["entry_slower"] == 0


def test_no_exact_candidate_is_an_error(kernel, monkeypatch):
    _fake_gpu(monkeypatch, "Quadro RTX 6000", T4, totals=[1] * 6, exact=[False] * 6)
    cells = dict(vars(kernel))
    with pytest.raises(RuntimeError, match="no candidate"):
        timing.pick_launch_config(cells, True)
    assert cells["CONFIG_OVERRIDE"] is None


def test_the_winner_rule_alone():
    def result(total, exact=True):
        return {"exact": [exact] * 3, "total_us": total if exact else None}
    assert timing.pick_winner([result(10), result(9), result(8, exact=False)]) == 1
    assert timing.pick_winner([result(10), result(10), result(11)]) == 0
    assert timing.pick_winner([result(10, exact=False), result(12)]) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs CPU tensors; a GPU: the marked tests")
def test_the_interpreters_launches_take_the_winner(kernel, monkeypatch):
    monkeypatch.setattr(kernel, "CONFIG_OVERRIDE", None)  # restored after the test
    _fake_gpu(monkeypatch, "Quadro RTX 6000", T4, totals=[100, 90, 95, 99, 100, 120])
    pick = timing.pick_launch_config(vars(kernel), True)
    winner = kernel.LaunchConfig(*pick["winner"])
    assert winner != kernel.LAUNCH_CONFIGS[T4]
    assert kernel.CONFIG_OVERRIDE == winner and kernel.launch_config(T4) == winner
    configs = []
    real = kernel.launch_arguments

    def launch_arguments(layout, out, config, capability):
        configs.append(config)
        return real(layout, out, config, capability)

    monkeypatch.setattr(kernel, "launch_arguments", launch_arguments)
    layer = helpers.make_layer(64, 256, torch.bfloat16, device="cpu")
    assert torch.equal(kernel.triton_dequantize_nf4(layer), helpers.bitsandbytes_bits(layer))
    assert configs == [winner]


# ---------------------------------------------------------------------------------------------
# CPU: nothing picked without a GPU or where the entry was measured; the line
# ---------------------------------------------------------------------------------------------
def test_nothing_is_picked_without_a_gpu_or_on_a_gpu_the_entry_was_measured_on(kernel, monkeypatch):
    measured = _fake_gpu(monkeypatch, "NVIDIA H200", (9, 0), totals=[1] * 6)
    cells = dict(vars(kernel))
    pick = timing.pick_launch_config(cells, False)
    assert pick["gpu"] is None and not pick["picked"]
    assert timing.launch_config_line(pick) == ("Launch configuration: none picked without a GPU (the interpreter "
                                               "runs DEFAULT_CONFIG); nothing timed.")
    pick = timing.pick_launch_config(cells, True)
    assert not pick["picked"] and pick["winner"] == pick["replaced"] == list(kernel.LAUNCH_CONFIGS[(9, 0)])
    assert timing.launch_config_line(pick) == (
        "Launch configuration: LAUNCH_CONFIGS[(9, 0)] (2048 w, 4 warps, gathered), measured on this GPU model "
        "(NVIDIA H200): not re-picked.")
    assert measured == [] and cells["CONFIG_OVERRIDE"] is None
    json.dumps(pick)


def test_the_line_says_what_ran_and_where_it_was_picked():
    pick = {"gpu": "Tesla T4", "picked": True, "table_entry": "LAUNCH_CONFIGS[(7, 5)]",
            "replaced": [4096, 4, 1, True, True], "winner": [2048, 4, 1, True, True], "entry_slower": 0.031,
            "candidates": [{}] * 6}
    assert timing.launch_config_line(pick) == (
        "Launch configuration: 2048 w, 4 warps, gathered, evict-first, picked on this Tesla T4 from 6 candidates; "
        "the table's LAUNCH_CONFIGS[(7, 5)] (4096 w, 4 warps, gathered, evict-first) was 3.1% slower.")
    pick["entry_slower"] = None
    assert timing.launch_config_line(pick).endswith("evict-first) was not bit-exact.")
    pick.update(winner=pick["replaced"], entry_slower=0.0)
    assert timing.launch_config_line(pick) == (
        "Launch configuration: LAUNCH_CONFIGS[(7, 5)] (4096 w, 4 warps, gathered, evict-first), picked on this "
        "Tesla T4 from 6 candidates: the table's entry was the fastest.")
    assert timing.describe_config((4096, 4, 0, False, False)) == "4096 w, 4 warps, L1, no PTX"


# ---------------------------------------------------------------------------------------------
# GPU: a real pick, this GPU answering as a T4
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def as_t4(kernel, monkeypatch):
    """The kernel module's device_capability answers (7, 5) for every GPU (Triton still builds for this one);
    CONFIG_OVERRIDE is None during the test and after it."""
    monkeypatch.setattr(kernel, "device_capability", lambda device: T4)
    monkeypatch.setattr(kernel, "CONFIG_OVERRIDE", None)
    return kernel


def _launched(work) -> set:
    """(grid, block) of every launch of our kernel during work(), from the profiler's trace."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        work()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        profile.export_chrome_trace(path)
        with open(path) as trace:
            events = json.load(trace)["traceEvents"]
    return {(tuple(e["args"]["grid"]), tuple(e["args"]["block"])) for e in events
            if e.get("cat") == "kernel" and "_dequantize_4bit_kernel" in e["name"]}


def _grid_and_block(config, n):
    return (-(-n // config.weights_per_program), 1, 1), (32 * config.num_warps, 1, 1)


@pytest.mark.gpu
def test_a_pick_on_this_gpu_answering_as_a_t4(as_t4):
    kernel = as_t4
    pick = timing.pick_launch_config(vars(kernel), True)
    print(f"\n{timing.launch_config_line(pick)}\ncost: {pick['cost']}")
    for candidate in pick["candidates"]:
        print(f"  {candidate['label']}: {candidate['gpu_us']} µs, exact {candidate['exact']}")
    assert set(pick) == PICK_KEYS and pick["picked"]
    assert pick["gpu"] == torch.cuda.get_device_name() and pick["capability"] == [7, 5]
    assert pick["replaced"] == list(kernel.LAUNCH_CONFIGS[T4])
    candidates = timing.launch_candidates(vars(kernel), T4)
    assert [c["config"] for c in pick["candidates"]] == [list(config) for config in candidates]
    for candidate in pick["candidates"]:
        assert set(candidate) == CANDIDATE_KEYS
        assert candidate["exact"] == [True, True, True], f"{candidate['label']} is not bit-exact"
        assert len(candidate["gpu_us"]) == 3 and all(us > 0 for us in candidate["gpu_us"])
    assert set(pick["cost"]) == COST_KEYS and pick["cost"]["timed_launches"] == 6 * 3 * 2 * 13
    json.dumps(pick)
    winner = kernel.LaunchConfig(*pick["winner"])
    assert kernel.CONFIG_OVERRIDE == winner and kernel.launch_config(T4) == winner
    layer = helpers.make_layer(1024, 512, torch.bfloat16)
    outputs = []
    launched = _launched(lambda: outputs.extend(kernel.triton_dequantize_nf4(layer) for _ in range(3)))
    assert launched == {_grid_and_block(winner, 1024 * 512)}, f"launched {launched}, the winner is {winner}"
    assert all(torch.equal(out, helpers.bitsandbytes_bits(layer)) for out in outputs)


@pytest.mark.gpu
def test_a_weight_planned_before_a_pick_launches_the_new_configuration(as_t4):
    kernel = as_t4
    entry = kernel.LAUNCH_CONFIGS[T4]
    other = kernel.LaunchConfig(8192, 8, 1, True)
    assert _grid_and_block(other, 1) != _grid_and_block(entry, 1)
    layer = helpers.make_layer(2048, 512, torch.float16)
    n = 2048 * 512
    assert _launched(lambda: [kernel.triton_dequantize_nf4(layer) for _ in range(3)]) == {_grid_and_block(entry, n)}
    timing.use_launch_config(vars(kernel), other)
    outputs = []
    launched = _launched(lambda: outputs.extend(kernel.triton_dequantize_nf4(layer) for _ in range(3)))
    assert launched == {_grid_and_block(other, n)}, "a weight's plan kept the configuration it was made with"
    assert all(torch.equal(out, helpers.bitsandbytes_bits(layer)) for out in outputs)
