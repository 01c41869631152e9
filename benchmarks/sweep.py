"""Every launch configuration in SWEEP, timed on this GPU's kernel-only clock (timing.gpu_time) at the
kernel shapes, each checked bit for bit against bitsandbytes: results/<gpu>/sweep.json, the evidence
behind this GPU's entry in LAUNCH_CONFIGS.

    python -m benchmarks.sweep
"""
from __future__ import annotations

import itertools
import statistics
import sys

import torch

import helpers
import timing
from benchmarks.cells import load_kernel_cells

# (weights per program, num_warps, lookup, evict_first): at least 8 weights a thread (16-byte stores)
SWEEP = [config for config in itertools.product((1024, 2048, 4096, 8192), (2, 4, 8), (0, 1), (True, False))
         if config[0] // (32 * config[1]) >= 8]


def sweep(kernel, capability) -> list[dict]:
    """Per configuration its GPU time (µs, median of 30 calls) at each kernel shape."""
    import bitsandbytes.functional as bnbf
    flush = timing.l2_flush()
    cases = []
    for out_features, in_features, dtype in helpers.KERNEL_SHAPES:
        layer = helpers.make_layer(out_features, in_features, dtype)
        layout = kernel.validate(layer.weight, layer.weight.quant_state)
        reference = bnbf.dequantize_4bit(layer.weight, layer.weight.quant_state)
        cases.append((f"{out_features}x{in_features}", layout, reference))
    rows = []
    for fields in SWEEP:
        config = kernel.LaunchConfig(*fields)
        row = {"config": list(config)}
        for name, layout, reference in cases:
            out = torch.empty_like(reference)
            kernel.launch_via_triton(layout, out, config, capability)
            if not torch.equal(out, reference):
                raise AssertionError(f"{config} differs from bitsandbytes at {name}")
            row[name] = timing.gpu_time(lambda: kernel.launch_via_triton(layout, out, config, capability),
                                         calls=30, flush=flush).median_us
        rows.append(row)
        print(row, flush=True)
    return rows


def slowdowns(rows: list[dict]) -> dict:
    """Per configuration its worst time over the fastest at each shape, minus 1 (0: fastest everywhere)."""
    shapes = [key for key in rows[0] if key != "config"]
    best = {shape: min(row[shape] for row in rows) for shape in shapes}
    return {str(row["config"]): max(row[shape] / best[shape] - 1 for shape in shapes) for row in rows}


def main():
    if not torch.cuda.is_available():
        sys.exit("benchmarks.sweep times kernels: it needs a CUDA GPU")
    kernel = load_kernel_cells()
    capability = torch.cuda.get_device_capability()
    env = helpers.environment(vars(kernel))
    rows = sweep(kernel, capability)
    worst = slowdowns(rows)
    current = kernel.launch_config(capability)
    steadiest = min(worst, key=worst.get)
    print(f"steadiest: {steadiest} (at most {worst[steadiest]:.1%} slower than the fastest at any shape); "
          f"LAUNCH_CONFIGS: {list(current)} ({worst[str(list(current))]:.1%}); "
          f"median slowdown {statistics.median(worst.values()):.1%}")
    path = helpers.results_dir(env) / "sweep.json"
    print("wrote", helpers.write_results(path, env, sweep=rows, worst_slowdown=worst, launch_config=list(current),
                                         measurement={"sweep": timing.GPU_TIME_METHOD}))


if __name__ == "__main__":
    main()
