"""Host time per call of the launch path (`timing.HOST_TIME_METHOD`), these cells against an older
notebook's and against what the path cannot go below, in interleaved rounds on the procedure's first
weight: results/<gpu>/host_cost.json.

    python -m benchmarks.host_cost OLD.ipynb

Timed: triton_dequantize_nf4 from these cells and from OLD's; the floor (HOST_COST_FLOOR); the C launch
alone (C_LAUNCH); a plan's launch alone (DIRECT) and the same launch through compiled.run (COMPILED_RUN);
a new weight's first call (FIRST_CALL), these cells' and OLD's; a call through Triton's own launch;
unsloth's fused path. Many short rounds: the GPU machines' hosts switch between a fast and a slow mode
within seconds, and a long round can catch one method in the other mode.
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

import helpers
import timing
from benchmarks.cells import load_kernel_cells

HOST_COST_FLOOR = ("torch.empty of the output plus the C launch function Triton's compiled launcher (compiled.run) "
                   "calls, called with the values compiled.run passes it for this weight (as the weight's kind holds "
                   "them: tests/test_launch_offline.py holds them to Triton's own) and a fixed stream, nothing checked")
C_LAUNCH = "the same C launch, allocating with torch.empty_strided as a plan does"
DIRECT = ("a plan's own launch alone (plan.launch: the current stream read, the C launch function called), "
          "allocating with torch.empty_strided, nothing checked")
COMPILED_RUN = ("the same launch through the compiled launcher's Python entry (compiled.run), as unsloth's "
                "triton_launch.py calls it and the launch path of the notebook before this one did, allocating "
                "with torch.empty_strided, nothing checked")
FIRST_CALL = ("a new weight's first call: a QuantState the launch path has not seen, with its own absmax and codebook "
              "tensors (bitsandbytes makes them per weight), its kind's compiled kernel known (from an earlier weight "
              "of its kind): validation, the weight's plan made and kept, its launch")


def kernel_arguments(plan, out):
    """The kernel's arguments for a launch of plan's weight into out, as compiled.run takes them."""
    return (*plan.inputs, out.data_ptr(), *plan.kind.after_output)


def unchecked_calls(plan, W, q) -> dict:
    """The floor (HOST_COST_FLOOR), the C launch alone (C_LAUNCH), a plan's launch alone (DIRECT) and the same
    launch through compiled.run (COMPILED_RUN), built from W's plan with its checks left out."""
    kind = plan.kind
    compiled = kind.compiled
    if kind.launch is not compiled.run.launch:
        raise RuntimeError("this Triton's kinds launch through compiled.run: no C launch function to time")
    plan(W, q)
    size, stride, dtype, device = plan.size, plan.stride, plan.dtype, plan.device
    stream = torch._C._cuda_getCurrentRawStream(plan.gpu)  # read once: the floor reads no stream

    def c_launch_into(new):
        arguments = kernel_arguments(plan, new)
        if kind.packed:
            arguments = (arguments,)
        kind.launch(*kind.grid, stream, *kind.fixed, *arguments)
        return new

    def floor():
        return c_launch_into(torch.empty(size, dtype=dtype, device=device))

    def c_launch_only():
        return c_launch_into(torch.empty_strided(size, stride, dtype=dtype, device=device))

    def direct():
        new = torch.empty_strided(size, stride, dtype=dtype, device=device)
        plan.launch(new)
        return new

    def compiled_run():
        new = torch.empty_strided(size, stride, dtype=dtype, device=device)
        current = torch._C._cuda_getCurrentRawStream(plan.gpu)
        compiled.run(*kind.grid, current, compiled.function, compiled.packed_metadata, None, None, None,
                     *kernel_arguments(plan, new))
        return new

    return {"floor": floor, "c_launch": c_launch_only, "direct": direct, "compiled_run": compiled_run}


def host_cost(new, old, rounds: int = 45, calls: int = 200) -> dict:
    """Every call above timed in `rounds` interleaved rounds of `calls` (timing.host_time); the median of the
    round medians, and the ratios the README and the launch path's header quote."""
    layer = helpers.make_layer(*helpers.KERNEL_SHAPES[0])
    W, q = layer.weight, layer.weight.quant_state
    for cells in (new, old):
        assert torch.equal(cells.triton_dequantize_nf4(layer), cells.triton_dequantize_nf4(layer))
    methods, skipped = helpers.dequantizers(new.triton_dequantize_nf4)
    fresh = {}  # per cells, a new weight for each call, W shared
    for cells in ("new", "old"):
        fresh[cells] = [copy.copy(q) for _ in range(rounds * (calls + 20) + 2)]
        for state in fresh[cells]:
            state.absmax, state.code = q.absmax.clone(), q.code.clone()
        fresh[cells] = iter(fresh[cells])
    timed = {"new": lambda: new.triton_dequantize_nf4(layer), "old": lambda: old.triton_dequantize_nf4(layer),
             **unchecked_calls(new._plans[new._identity(q)], W, q),
             "first_call": lambda: new.dequantize_nf4(W, next(fresh["new"])),
             "old_first_call": lambda: old.dequantize_nf4(W, next(fresh["old"])),
             "via_triton": lambda: new.dequantize_nf4_via_triton(W, q)}
    if "unsloth_fused" in methods:
        timed["unsloth_fused"] = lambda: methods["unsloth_fused"](layer)
    assert all(torch.equal(timed[name](), timed["old"]()) for name in timed)
    samples = {name: [] for name in timed}
    for _ in range(rounds):
        for name, fn in timed.items():
            samples[name].append(timing.host_time(fn, calls=calls).median_us)
    medians = {name: sorted(values)[rounds // 2] for name, values in samples.items()}
    fused = medians.get("unsloth_fused")
    return {"layer": str(helpers.KERNEL_SHAPES[0]), "method": timing.HOST_TIME_METHOD, "floor": HOST_COST_FLOOR,
            "c_launch": C_LAUNCH, "direct": DIRECT, "compiled_run": COMPILED_RUN, "first_call": FIRST_CALL,
            "calls_per_round": calls,
            "rounds_us": samples, "median_us": medians, "new_over_floor": medians["new"] / medians["floor"],
            "old_over_floor": medians["old"] / medians["floor"], "new_over_old": medians["new"] / medians["old"],
            "direct_over_c_launch": medians["direct"] / medians["c_launch"],
            "compiled_run_over_direct": medians["compiled_run"] / medians["direct"],
            "first_call_over_fused": medians["first_call"] / fused if fused else None,
            "old_first_call_over_fused": medians["old_first_call"] / fused if fused else None,
            "via_triton_over_fused": medians["via_triton"] / fused if fused else None,
            "skipped_baselines": skipped}


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
          f"{table['new_over_old']:.3f}, direct/C launch {table['direct_over_c_launch']:.3f}, compiled.run/direct "
          f"{table['compiled_run_over_direct']:.3f}, first call/fused "
          f"{table['first_call_over_fused'] or float('nan'):.3f}, old first call/fused "
          f"{table['old_first_call_over_fused'] or float('nan'):.3f}")
    path = helpers.results_dir(env) / "host_cost.json"
    print("wrote", helpers.write_results(path, env, {"host_cost": timing.HOST_TIME_METHOD}, host_cost=table))


if __name__ == "__main__":
    main()
