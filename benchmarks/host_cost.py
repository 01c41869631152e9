"""Host time per call of the launch path (`timing.HOST_TIME_METHOD`) against what a launch cannot go below and what
the launch path's rule cannot read less than, in interleaved rounds on the procedure's first weight; with two GPUs,
the same weight on the second GPU called with either GPU current; the procedure's timed loops with that least:
results/<gpu>/host_cost.json.

    python -m benchmarks.host_cost

Timed: triton_dequantize_nf4; the floor (HOST_COST_FLOOR); the least reads before it (LEAST_READS); a new weight's
first call (FIRST_CALL); unsloth's fused path; the pieces of a call, each alone (PIECES). Many short rounds: the GPU
machines' hosts switch between a fast and a slow mode within seconds, and a long round can catch one method in the
other mode.
"""
from __future__ import annotations

import copy
import functools
import operator
import sys
import timeit

import torch

import helpers
import timing
from benchmarks.cells import load_kernel_cells

HOST_COST_FLOOR = ("torch.empty_strided of the output plus the compiled kernel's launcher (compiled.run), as a plan "
                   "calls it for this weight (its grid, arguments and the current stream), nothing read or checked")
FIRST_CALL = ("a new weight's first call: a QuantState the launch path has not seen, with its own absmax and codebook "
              "tensors (bitsandbytes makes them per weight), its kernel compiled (from an earlier weight of its kind): "
              "validation, the plan made and kept, its launch")
LEAST_READS = ("the floor after only what the launch path's rule must read of a nested weight, read as the cells read "
               "(plain tensors): Triton's state (triton_launch_is_plain); the address, dtype and shape (W) or element "
               "count of W and of each tensor the kernel reads; the other fields by value; a dict lookup. Fewer reads "
               "than the rule needs (no contiguity, sign bits, storage extent or exact types): one lean reading, as "
               "measured, not a proof that none is leaner")
LEAST_READS_PROCEDURE = ("the published procedure's timed loops (per case: up, gate, down, each dequantized, .t(), "
                         "synchronized; 1,000 iterations) by these cells, by LEAST_READS and by unsloth's fused path, "
                         "in rounds, the order rotated; per method the rounds' totals over the cases, their median; "
                         "a ratio is the median over rounds of the two methods' totals in a round")
PIECES = ("some pieces of a call, each timed alone in a loop of its own, as the cells run it on the procedure's first "
          "weight: Triton's state, the rule's key (key_of), LEAST_READS' key, the plan's lookup; a first call's "
          "reading of the state, its validation (of the state read; validation caches nothing), its output and the "
          "context that makes its GPU current (launch_setup), its launch's arguments and its kind's key; one read "
          "of a tensor's address; an empty call (timeit's own cost per call). Per round the best of 3 runs of 2,000 "
          "calls (timeit: each piece repeated, its data in cache, gc off; none launches or waits for the GPU), the "
          "median over 15 rounds. What a piece costs repeated, not its share of a call: they do not add up to one, "
          "and a call's other parts (the launch, the GPU switch, the plan's making and keeping) are not timed")
ANOTHER_GPU = ("a weight on cuda:1 (a model split over two GPUs): a later call with cuda:1 current, and with cuda:0 "
               "current (the launch path makes the weight's GPU current for the launch), ours and unsloth's fused "
               "path; in the same rounds, ours on the weight on cuda:0. Each timed alike (the weight's GPU "
               "synchronized before each call), the order rotated; a difference is the median over rounds of the "
               "two times' difference in a round, with its quartiles (the host switches speed within seconds: "
               "between rounds, and at times within one)")
RATIOS = ("each ratio: the median over rounds of the two calls' medians' ratio in a round (the calls' order rotated "
          "round by round)")


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


LEAST_VALUES = operator.attrgetter("quant_type", "dtype", "shape", "blocksize", "nested")
LEAST_VALUES2 = operator.attrgetter("blocksize", "dtype", "nested")


def least_key(W, q):
    """LEAST_READS' key of a nested weight's W (its parameter, a Params4bit) and quant state q."""
    absmax, offset, absmax2, code2 = q.absmax, q.offset, q.state2.absmax, q.state2.code
    with torch._C.DisableTorchFunctionSubclass():  # (W is a Params4bit)
        return (W.data_ptr(), W.dtype, W.shape, LEAST_VALUES(q), LEAST_VALUES2(q.state2),
                absmax.data_ptr(), absmax.dtype, absmax.numel(), offset.data_ptr(), offset.dtype, offset.numel(),
                absmax2.data_ptr(), absmax2.dtype, absmax2.numel(), code2.data_ptr(), code2.dtype, code2.numel())


def least_reads(cells, layers):
    """LEAST_READS for `layers` (nested weights, each with its plan in `cells`): a call taking a layer."""
    floors = {}
    for layer in layers:
        W, q = layer.weight, layer.weight.quant_state
        floors[least_key(W, q)] = floor_call(cells._plans[cells.key_of(W, q)[0]])

    def call(layer):
        W = layer._parameters["weight"]
        if not cells.triton_launch_is_plain():
            raise RuntimeError("a Triton hook or mode is set: LEAST_READS times plain launches only")
        return floors[least_key(W, W.quant_state)]()
    return call


def call_pieces(cells, layer, rounds: int = 15, calls: int = 2000) -> dict:
    """PIECES of a later and of a first call of `layer` (whose plan is made: read_state and validate cache nothing,
    so they run as in a first call), each as the cells run it, in `rounds` interleaved rounds."""
    W, q = layer._parameters["weight"], layer.weight.quant_state
    key = cells.key_of(W, q)[0]
    state = cells.read_state(W, q)
    layout = cells.validate(W, q, state)
    capability, config, out, _ = cells.launch_setup(layout)
    _, args, constexprs, options = cells.launch_arguments(layout, out, config, capability)
    key_of, plans, read_state, validate = cells.key_of, cells._plans, cells.read_state, cells.validate
    launch_setup, launch_arguments, kind_key = cells.launch_setup, cells.launch_arguments, cells.kind_key
    kernel, gpu, absmax = cells._dequantize_4bit_kernel, layout.packed.get_device(), q.absmax
    pieces = {"triton_launch_is_plain": cells.triton_launch_is_plain,
              "key_of": lambda: key_of(W, q),
              "least_key": lambda: least_key(W, q),
              "_plans.get": lambda: plans.get(key),
              "read_state": lambda: read_state(W, q),
              "validate": lambda: validate(W, q, state),
              "launch_setup": lambda: launch_setup(layout),
              "launch_arguments": lambda: launch_arguments(layout, out, config, capability),
              "kind_key": lambda: kind_key(kernel, args, constexprs, options, gpu),
              "absmax.data_ptr": lambda: absmax.data_ptr(),
              "an empty call": lambda: None}
    samples = {name: [] for name in pieces}
    for _ in range(rounds):
        for name, piece in pieces.items():
            samples[name].append(min(timeit.repeat(piece, number=calls, repeat=3)) / calls * 1e6)
    median = {name: sorted(values)[rounds // 2] for name, values in samples.items()}
    return {"what": PIECES, "rounds_us": samples, "median_us": median}


def over_rounds(first, second, combine, q: float = 0.5):
    """The q-quantile (the median unless told) over rounds of combine(first's time, second's in the same round)."""
    return helpers.quantile([combine(a, b) for a, b in zip(first, second, strict=True)], q)


def least_reads_procedure(cells, fused, rounds: int = 5) -> dict:
    """LEAST_READS_PROCEDURE, every output checked against bitsandbytes first; the fused path's time over ours and
    over LEAST_READS', round by round."""
    seconds = {name: [0.0] * rounds for name in ("ours", "least_reads", "unsloth_fused")}
    for _, _, hd, m, _, dtype in helpers.PROCEDURE_CASES:
        mlp = helpers.MLP(hd, m, dtype, "cuda")
        layers = (mlp.up_proj, mlp.gate_proj, mlp.down_proj)
        references = [helpers.bitsandbytes_bits(layer) for layer in layers]
        assert all(torch.equal(cells.triton_dequantize_nf4(layer), reference)  # (plans made)
                   for layer, reference in zip(layers, references))
        methods = {"ours": cells.triton_dequantize_nf4, "least_reads": least_reads(cells, layers),
                   "unsloth_fused": fused}
        for fn in methods.values():  # checked (ours: its plan's launch, as LEAST_READS'), then a warm host, untimed
            assert all(torch.equal(fn(layer), reference) for layer, reference in zip(layers, references))
            timing.timed_calls(fn, layers, 100)
        names = list(seconds)
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                seconds[name][r] += sum(timing.timed_calls(methods[name], layers, 1000))
    median = {name: sorted(values)[rounds // 2] for name, values in seconds.items()}
    return {"what": LEAST_READS_PROCEDURE, "rounds_s": seconds, "median_s": median,
            "fused_over_ours": over_rounds(seconds["unsloth_fused"], seconds["ours"], operator.truediv),
            "fused_over_least_reads": over_rounds(seconds["unsloth_fused"], seconds["least_reads"], operator.truediv)}


def fresh_states(q, count):
    """`count` copies of q, each with its own absmax and codebook tensors: a new weight's quant state each call."""
    states = [copy.copy(q) for _ in range(count)]
    for state in states:
        state.absmax, state.code = q.absmax.clone(), q.code.clone()
    return iter(states)


def host_cost(cells, rounds: int = 45, calls: int = 200) -> dict:
    """Every call above timed in `rounds` interleaved rounds of `calls`, each output checked against bitsandbytes
    first; the median of the round medians, and the ratios the README quotes (RATIOS)."""
    layer = helpers.make_layer(*helpers.KERNEL_SHAPES[0])
    W, q = layer.weight, layer.weight.quant_state
    reference = helpers.bitsandbytes_bits(layer)
    assert all(torch.equal(cells.triton_dequantize_nf4(layer), reference) for _ in range(2))
    methods, skipped = helpers.dequantizers(cells.triton_dequantize_nf4)
    fresh = fresh_states(q, rounds * (calls + 20) + 1)
    timed = {"ours": lambda: cells.triton_dequantize_nf4(layer),
             "floor": floor_call(cells._plans[cells.key_of(W, q)[0]]),
             "least_reads": functools.partial(least_reads(cells, [layer]), layer),
             "first_call": lambda: cells.dequantize_nf4(W, next(fresh))}
    if "unsloth_fused" in methods:
        timed["unsloth_fused"] = lambda: methods["unsloth_fused"](layer)
    assert all(torch.equal(timed[name](), reference) for name in timed)
    samples = {name: [] for name in timed}
    names = list(timed)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(timing.host_time(timed[name], calls=calls).median_us)
    median = {name: sorted(values)[rounds // 2] for name, values in samples.items()}
    fused = samples.get("unsloth_fused")
    first_call_over_fused = None  # (no fused path installed)
    if fused is not None:
        first_call_over_fused = over_rounds(samples["first_call"], fused, operator.truediv)
    table = {"layer": str(helpers.KERNEL_SHAPES[0]), "method": timing.HOST_TIME_METHOD, "floor": HOST_COST_FLOOR,
             "least_reads": LEAST_READS, "first_call": FIRST_CALL, "calls_per_round": calls, "rounds_us": samples,
             "median_us": median, "ratios": RATIOS,
             "ours_over_floor": over_rounds(samples["ours"], samples["floor"], operator.truediv),
             "least_reads_over_floor": over_rounds(samples["least_reads"], samples["floor"], operator.truediv),
             "first_call_over_fused": first_call_over_fused,
             "skipped_baselines": skipped}
    table["pieces"] = call_pieces(cells, layer)
    if torch.cuda.device_count() > 1:
        table["another_gpu"] = another_gpu(cells, methods, rounds, calls, layer)
    if fused:
        table["least_reads_procedure"] = least_reads_procedure(cells, methods["unsloth_fused"])
    return table


def another_gpu(cells, methods, rounds: int, calls: int, layer_on_gpu_0) -> dict:
    """ANOTHER_GPU: the procedure's first weight on cuda:1, a later call timed with cuda:1 current and with
    cuda:0 current, ours and (where installed) unsloth's fused path, and ours on `layer_on_gpu_0` with cuda:0
    current; each output checked against bitsandbytes in every round."""
    import bitsandbytes.functional as bnbf
    layer_on_gpu_1 = helpers.make_layer(*helpers.KERNEL_SHAPES[0], device="cuda:1")
    on_gpu_1 = (layer_on_gpu_1, bnbf.dequantize_4bit(layer_on_gpu_1.weight, layer_on_gpu_1.weight.quant_state))
    on_gpu_0 = (layer_on_gpu_0, helpers.bitsandbytes_bits(layer_on_gpu_0))
    calls_timed = {f"{name}, cuda:{current} current": (fn, current, on_gpu_1)
                   for current in (1, 0) for name, fn in methods.items() if name in ("ours", "unsloth_fused")}
    calls_timed["ours, a weight on cuda:0, cuda:0 current"] = (methods["ours"], 0, on_gpu_0)
    samples = {name: [] for name in calls_timed}
    names = list(calls_timed)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn, current, (layer, reference) = calls_timed[name]
            torch.cuda.set_device(current)
            assert torch.equal(fn(layer), reference), name
            timed = timing.host_time(functools.partial(fn, layer), calls=calls, device=layer.weight.device)
            samples[name].append(timed.median_us)
            assert torch.cuda.current_device() == current, f"{name} left another GPU current"
    torch.cuda.set_device(0)
    median = {name: sorted(values)[rounds // 2] for name, values in samples.items()}
    differences = {"ours, cuda:0 current minus cuda:1 current": ("ours, cuda:0 current", "ours, cuda:1 current"),
                   "ours, cuda:1 current minus the weight on cuda:0": ("ours, cuda:1 current",
                                                                       "ours, a weight on cuda:0, cuda:0 current"),
                   "unsloth_fused, cuda:0 current minus cuda:1 current": ("unsloth_fused, cuda:0 current",
                                                                          "unsloth_fused, cuda:1 current")}
    measured = {what: pair for what, pair in differences.items() if set(pair) <= set(samples)}
    difference_us = {what: over_rounds(samples[first], samples[second], operator.sub)
                     for what, (first, second) in measured.items()}
    quartiles_us = {what: [over_rounds(samples[first], samples[second], operator.sub, q) for q in (0.25, 0.75)]
                    for what, (first, second) in measured.items()}
    return {"what": ANOTHER_GPU, "rounds_us": samples, "median_us": median, "difference_us": difference_us,
            "difference_quartiles_us": quartiles_us}


def main():
    if not torch.cuda.is_available():
        sys.exit("benchmarks.host_cost times a GPU's launches: it needs a CUDA GPU")
    cells = load_kernel_cells()
    env = helpers.environment(vars(cells))
    table = host_cost(cells)
    print({name: round(us, 2) for name, us in table["median_us"].items()})
    print(f"ours/floor {table['ours_over_floor']:.3f}, least reads/floor {table['least_reads_over_floor']:.3f}, "
          f"first call/fused {table['first_call_over_fused'] or float('nan'):.3f}")
    if "another_gpu" in table:
        print({name: round(us, 2) for name, us in table["another_gpu"]["median_us"].items()})
        print({what: round(us, 2) for what, us in table["another_gpu"]["difference_us"].items()})
    if "least_reads_procedure" in table:
        print({name: round(s, 3) for name, s in table["least_reads_procedure"]["median_s"].items()})
    print({name: round(us, 2) for name, us in table["pieces"]["median_us"].items()})
    path = helpers.results_dir(env) / "host_cost.json"
    print("wrote", helpers.write_results(path, env, {"host_cost": timing.HOST_TIME_METHOD, "pieces": PIECES},
                                       host_cost=table))


if __name__ == "__main__":
    main()
