"""Host time per call of the launch path (`timing.HOST_TIME_METHOD`), these cells against an older notebook's
and against what a launch cannot go below, in interleaved rounds on the procedure's first weight; with two GPUs,
the same weight on the second GPU called with either GPU current: results/<gpu>/host_cost.json.

    python -m benchmarks.host_cost OLD.ipynb

Timed: triton_dequantize_nf4 from these cells and from OLD's; the floor (HOST_COST_FLOOR); the floor after the
least a later call must read (LEAST_READS); a new weight's first call (FIRST_CALL), these cells' and OLD's; a call
through Triton's own launch; unsloth's fused path. Many short rounds: the GPU machines' hosts switch between a fast
and a slow mode within seconds, and a long round can catch one method in the other mode. Then the procedure's timed
loops by these cells, by LEAST_READS and by the fused path (LEAST_READS_PROCEDURE).
"""
from __future__ import annotations

import argparse
import copy
import functools
import operator
import sys
import time
from pathlib import Path

import torch

import helpers
import timing
from benchmarks.cells import load_kernel_cells

HOST_COST_FLOOR = ("torch.empty_strided of the output plus the compiled kernel's launcher (compiled.run), as a plan "
                   "calls it for this weight (its grid, arguments and the current stream), nothing read or checked")
FIRST_CALL = ("a new weight's first call: a QuantState the launch path has not seen, with its own absmax and codebook "
              "tensors (bitsandbytes makes them per weight), its kernel compiled (from an earlier weight of its kind): "
              "validation, the plan made and kept, its launch")
LEAST_READS = ("a lower bound for a later call of a nested weight by any launch path that keeps the cells' rule (a "
               "plan launches only on what this call checked): the floor, after only these reads, fewer than the rule "
               "needs: Triton's state (triton_launch_is_plain); for W and each tensor the kernel reads (absmax, "
               "offset, state2.absmax, state2.code) its address, dtype and shape (W) or element count; the quant "
               "state's other fields by value; the floor found by them in a dict. Not read: contiguity, sign and "
               "conjugate bits, storage extent, exact types; W's GPU is not made current")
LEAST_READS_PROCEDURE = ("the published procedure's timed loops (per case: up, gate, down, each dequantized, .t(), "
                         "synchronized; 1,000 iterations) by these cells, by LEAST_READS and by unsloth's fused path, "
                         "in rounds, the order rotated; per method the median of the rounds' totals")
ANOTHER_GPU = ("a weight on cuda:1 (a model split over two GPUs): a later call with cuda:1 current, and with cuda:0 "
               "current (the launch path makes the weight's GPU current for the launch), ours and unsloth's fused path")


def floor_call(plan):
    """A plan's launch with nothing read or checked: a new output by torch.empty_strided, of the shape, strides and
    dtype the plan makes (its new_output, the table's new_empty_strided), and compiled.run (HOST_COST_FLOOR)."""
    compiled, gpu = plan.compiled, plan.gpu
    shape, stride = plan.new_output.args
    dtype, device = plan.new_output.keywords["dtype"], plan.new_output.func.__self__.device

    def floor():
        out = torch.empty_strided(shape, stride, dtype=dtype, device=device)
        compiled.run(*plan.grid, torch._C._cuda_getCurrentRawStream(gpu), compiled.function,
                     compiled.packed_metadata, None, None, None, *plan.before_out, out.data_ptr(), *plan.after_out)
        return out
    return floor


def least_reads(cells, layers):
    """LEAST_READS for `layers` (nested weights each with a plan in `cells`): a call taking a layer."""
    values = operator.attrgetter("quant_type", "dtype", "shape", "blocksize", "nested")
    values2 = operator.attrgetter("blocksize", "dtype", "nested")

    def key(W, q):
        state2 = q.state2
        absmax, offset, absmax2, code2 = q.absmax, q.offset, state2.absmax, state2.code
        return (W.data_ptr(), W.dtype, W.shape, values(q), values2(state2),
                absmax.data_ptr(), absmax.dtype, absmax.numel(), offset.data_ptr(), offset.dtype, offset.numel(),
                absmax2.data_ptr(), absmax2.dtype, absmax2.numel(), code2.data_ptr(), code2.dtype, code2.numel())

    floors = {}
    for layer in layers:
        W, q = layer.weight, layer.weight.quant_state
        floors[key(W, q)] = floor_call(cells._plans[cells.key_of(W, q)[0]])

    def call(layer):
        W = layer._parameters["weight"]
        if not cells.triton_launch_is_plain():
            raise RuntimeError("a Triton hook or mode is set: LEAST_READS times plain launches only")
        return floors[key(W, W.quant_state)]()
    return call


def procedure_loop(dequantize, layers, iterations: int) -> float:
    """Wall clock of the procedure's timed loop over `layers` (up, gate, down): each dequantized, .t(), synchronized."""
    start = time.perf_counter()
    for _ in range(iterations):
        for layer in layers:
            dequantize(layer).t()
            torch.cuda.synchronize()
    return time.perf_counter() - start


def least_reads_procedure(new, fused, rounds: int = 5, iterations: int = 1000) -> dict:
    """LEAST_READS_PROCEDURE: seconds per round (summed over the cases) per method, the medians, and the fused path's
    median over each's (the puzzle's speedup, here with the median of the totals)."""
    methods = {"ours": new.triton_dequantize_nf4, "least_reads": None, "unsloth_fused": fused}
    seconds = {name: [0.0] * rounds for name in methods}
    for _, _, hd, m, _, dtype in helpers.PROCEDURE_CASES:
        mlp = helpers.MLP(hd, m, dtype, "cuda")
        layers = (mlp.up_proj, mlp.gate_proj, mlp.down_proj)
        for layer in layers:
            reference = helpers.bitsandbytes_bits(layer)
            assert all(torch.equal(new.triton_dequantize_nf4(layer), reference) for _ in range(2))
        methods["least_reads"] = least_reads(new, layers)
        for layer in layers:
            assert torch.equal(methods["least_reads"](layer), new.triton_dequantize_nf4(layer))
        names = list(methods)
        for name in names:
            procedure_loop(methods[name], layers, 100)  # untimed: a warm host
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                seconds[name][r] += procedure_loop(methods[name], layers, iterations)
        del mlp, layers
    median = {name: sorted(values)[rounds // 2] for name, values in seconds.items()}
    return {"what": LEAST_READS_PROCEDURE, "rounds_s": seconds, "median_s": median,
            "fused_over_ours": median["unsloth_fused"] / median["ours"],
            "fused_over_least_reads": median["unsloth_fused"] / median["least_reads"]}


def fresh_states(q, count):
    """`count` copies of q, each with its own absmax and codebook tensors: a new weight's quant state each call."""
    states = [copy.copy(q) for _ in range(count)]
    for state in states:
        state.absmax, state.code = q.absmax.clone(), q.code.clone()
    return iter(states)


def host_cost(new, old, rounds: int = 45, calls: int = 200) -> dict:
    """Every call above timed in `rounds` interleaved rounds of `calls`; the median of the round medians, and the
    ratios the README quotes."""
    layer = helpers.make_layer(*helpers.KERNEL_SHAPES[0])
    W, q = layer.weight, layer.weight.quant_state
    reference = helpers.bitsandbytes_bits(layer)
    for cells in (new, old):
        assert all(torch.equal(cells.triton_dequantize_nf4(layer), reference) for _ in range(2))
    methods, skipped = helpers.dequantizers(new.triton_dequantize_nf4)
    fresh = {cells: fresh_states(q, rounds * (calls + 20) + 2) for cells in ("new", "old")}
    plan = new._plans[new.key_of(W, q)[0]]
    timed = {"new": lambda: new.triton_dequantize_nf4(layer), "old": lambda: old.triton_dequantize_nf4(layer),
             "floor": floor_call(plan), "least_reads": functools.partial(least_reads(new, [layer]), layer),
             "first_call": lambda: new.dequantize_nf4(W, next(fresh["new"])),
             "old_first_call": lambda: old.dequantize_nf4(W, next(fresh["old"])),
             "via_triton": lambda: new.dequantize_nf4_via_triton(W, q)}
    if "unsloth_fused" in methods:
        timed["unsloth_fused"] = lambda: methods["unsloth_fused"](layer)
    assert all(torch.equal(timed[name](), reference) for name in timed)
    samples = {name: [] for name in timed}
    for _ in range(rounds):
        for name, fn in timed.items():
            samples[name].append(timing.host_time(fn, calls=calls).median_us)
    median = {name: sorted(values)[rounds // 2] for name, values in samples.items()}
    fused = median.get("unsloth_fused")
    table = {"layer": str(helpers.KERNEL_SHAPES[0]), "method": timing.HOST_TIME_METHOD, "floor": HOST_COST_FLOOR,
             "least_reads": LEAST_READS, "first_call": FIRST_CALL, "calls_per_round": calls, "rounds_us": samples,
             "median_us": median, "new_over_floor": median["new"] / median["floor"],
             "least_reads_over_floor": median["least_reads"] / median["floor"],
             "old_over_floor": median["old"] / median["floor"],
             "new_over_old": median["new"] / median["old"],
             "first_call_over_fused": median["first_call"] / fused if fused else None,
             "old_first_call_over_fused": median["old_first_call"] / fused if fused else None,
             "via_triton_over_fused": median["via_triton"] / fused if fused else None,
             "skipped_baselines": skipped}
    if torch.cuda.device_count() > 1:
        table["another_gpu"] = another_gpu(new, methods, rounds, calls)
    if fused:
        table["least_reads_procedure"] = least_reads_procedure(new, methods["unsloth_fused"])
    return table


def another_gpu(new, methods, rounds: int, calls: int) -> dict:
    """ANOTHER_GPU: the procedure's first weight on cuda:1, a later call timed with cuda:1 current and with
    cuda:0 current, ours and (where installed) unsloth's fused path; each output checked against bitsandbytes."""
    import bitsandbytes.functional as bnbf
    layer = helpers.make_layer(*helpers.KERNEL_SHAPES[0], device="cuda:1")
    reference = bnbf.dequantize_4bit(layer.weight, layer.weight.quant_state)
    methods = {"ours": new.triton_dequantize_nf4, **{name: fn for name, fn in methods.items() if name == "unsloth_fused"}}
    samples = {f"{name}, cuda:{current} current": [] for current in (1, 0) for name in methods}
    for _ in range(rounds):
        for current in (1, 0):
            torch.cuda.set_device(current)
            for name, fn in methods.items():
                assert torch.equal(fn(layer), reference), (name, current)
                samples[f"{name}, cuda:{current} current"].append(host_time_on_gpu_1(lambda: fn(layer), calls))
    torch.cuda.set_device(0)
    median = {name: sorted(values)[rounds // 2] for name, values in samples.items()}
    ours_gap = median["ours, cuda:0 current"] - median["ours, cuda:1 current"]
    return {"what": ANOTHER_GPU, "rounds_us": samples, "median_us": median, "ours_other_minus_own_us": ours_gap}


def host_time_on_gpu_1(fn, calls: int) -> float:
    """timing.host_time's median for a call whose GPU work runs on cuda:1, whichever GPU is current: cuda:1 is
    synchronized (untimed) before each call."""
    samples = []
    for _ in range(calls):
        torch.cuda.synchronize(1)
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize(1)
    return sorted(samples)[calls // 2]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old_notebook", type=Path, help="the notebook whose cells these are compared with")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("benchmarks.host_cost times a GPU's launches: it needs a CUDA GPU")
    new = load_kernel_cells()
    # an older notebook's cells by their tags then: the paste unit (once split, `fast-launch`) and the model patch
    old = load_kernel_cells(args.old_notebook, name="nf4_old_cells", tags=("kernel", "fast-launch", "model-patch"))
    env = helpers.environment(vars(new))
    table = host_cost(new, old)
    table["old_notebook"] = args.old_notebook.name
    print({name: round(us, 2) for name, us in table["median_us"].items()})
    print(f"new/floor {table['new_over_floor']:.3f}, old/floor {table['old_over_floor']:.3f}, new/old "
          f"{table['new_over_old']:.3f}, first call/fused {table['first_call_over_fused'] or float('nan'):.3f}, "
          f"old first call/fused {table['old_first_call_over_fused'] or float('nan'):.3f}")
    print(f"least reads/floor {table['least_reads_over_floor']:.3f}")
    if "another_gpu" in table:
        print({name: round(us, 2) for name, us in table["another_gpu"]["median_us"].items()})
    if "least_reads_procedure" in table:
        bound = table["least_reads_procedure"]
        print({name: round(s, 3) for name, s in bound["median_s"].items()},
              f"fused/ours {bound['fused_over_ours']:.3f}, fused/least reads {bound['fused_over_least_reads']:.3f}")
    path = helpers.results_dir(env) / "host_cost.json"
    print("wrote", helpers.write_results(path, env, {"host_cost": timing.HOST_TIME_METHOD}, host_cost=table))


if __name__ == "__main__":
    main()
