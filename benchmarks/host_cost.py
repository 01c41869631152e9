"""Host time per call of the launch path (`timing.HOST_TIME_METHOD`), these cells beside an older
notebook's and beside what the path cannot go below, in interleaved rounds on the procedure's first
weight: results/<gpu>/host_cost.json.

    python -m benchmarks.host_cost OLD.ipynb

Timed: triton_dequantize_nf4 from these cells and from OLD's; the floor (HOST_COST_FLOOR); the replay
alone; the compiled launcher's Python entry (FIXED_CALL); a new weight's first call (FIRST_CALL); a
call through Triton's own launch; unsloth's fused path. Many short rounds: the GPU
machines' hosts switch between a fast and a slow mode within seconds, and a long round can catch one
method in the other mode.
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

HOST_COST_FLOOR = ("torch.empty of the output plus Triton's C launcher called with the arguments Triton passed it, "
                   "nothing checked (a plan's own recorded launch, allocating with torch.empty)")
FIXED_CALL = ("the compiled launcher's Python entry called directly with the same arguments, nothing checked "
              "(unsloth's triton_launch.py style), allocating with torch.empty_strided as the replay does")
FIRST_CALL = ("a new weight's first call: a QuantState the launch path has not seen, with its own absmax and codebook "
              "tensors (bitsandbytes makes them per weight), its launch's template recorded before (by an earlier weight "
              "of its key): validation, the weight's plan made from the template (its fields watched, a finalizer "
              "on its QuantState), its launch")


def unchecked_calls(plan, kernel, W, q) -> dict:
    """The floor (HOST_COST_FLOOR), the replay alone and the fixed call (FIXED_CALL), built from W's plan: its own
    allocation and recorded launch, with its checks left out."""
    out = plan(W, q)
    size, stride, dtype, device, gpu = plan.size, plan.stride, plan.dtype, plan.device, plan.gpu

    def launch_into(new):
        plan.launch.into(new, gpu)
        return new

    def floor():
        return launch_into(torch.empty(size, dtype=dtype, device=device))

    def replay():
        return launch_into(torch.empty_strided(size, stride, dtype=dtype, device=device))

    layout = kernel.validate(W, q).layout
    capability = kernel.device_capability(out.device)
    grid, args, constexprs, options = kernel.launch_arguments(layout, out, kernel.launch_config(capability),
                                                              capability)
    compiled = kernel._dequantize_4bit_kernel[grid](*args, **constexprs, **options)
    constants = [constexprs[name] for name in kernel._dequantize_4bit_kernel.arg_names[len(args):]]
    if kernel.TRITON_VERSION < (3, 3):  # Triton 3.2's launcher takes no constexprs
        constants = []
    addresses = [a.data_ptr() if torch.is_tensor(a) else a for a in args]
    at = [a is out for a in args].index(True)
    before, after, grid3 = addresses[:at], [*addresses[at + 1:], *constants], (*grid, 1, 1)[:3]

    def fixed_call():
        new = torch.empty_strided(size, stride, dtype=dtype, device=device)
        stream = torch._C._cuda_getCurrentRawStream(gpu)
        compiled.run(*grid3, stream, compiled.function, compiled.packed_metadata, None, None, None,
                     *before, new.data_ptr(), *after)
        return new

    return {"floor": floor, "replay": replay, "fixed_call": fixed_call}


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
             **unchecked_calls(new._plans[new._identity(q)], new, W, q),
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
            "fixed_call": FIXED_CALL, "first_call": FIRST_CALL, "calls_per_round": calls,
            "rounds_us": samples, "median_us": medians, "new_over_floor": medians["new"] / medians["floor"],
            "old_over_floor": medians["old"] / medians["floor"], "new_over_replay": medians["new"] / medians["replay"],
            "fixed_call_over_replay": medians["fixed_call"] / medians["replay"],
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
    print(f"new/floor {table['new_over_floor']:.3f}, old/floor {table['old_over_floor']:.3f}, new/replay "
          f"{table['new_over_replay']:.3f}, fixed call/replay {table['fixed_call_over_replay']:.3f}, first call/fused "
          f"{table['first_call_over_fused'] or float('nan'):.3f}")
    path = helpers.results_dir(env) / "host_cost.json"
    print("wrote", helpers.write_results(path, env, {"host_cost": timing.HOST_TIME_METHOD}, host_cost=table))


if __name__ == "__main__":
    main()
