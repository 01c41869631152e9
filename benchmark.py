"""Benchmark the notebook's kernel against unsloth's fast_dequantize (fused and classic paths) and
bitsandbytes on the GPU this runs on; print the tables and write results/<gpu>/benchmark.json.

    python benchmark.py              # kernel-only table, the published procedure, CPU cost per call
    python benchmark.py --sweep      # also time every configuration in SWEEP: results/<gpu>/sweep.json
"""
from __future__ import annotations

import argparse
import itertools
import sys

import torch

import helpers

# Candidate launch configurations: (weights per program, num_warps, LOOKUP, STREAM), each tried
# for every size. The sweep behind the shipped table: results/<gpu>/sweep.json.
SWEEP = [cfg for cfg in itertools.product((1024, 2048, 4096, 8192), (2, 4, 8), (0, 1, 2), (True, False))
         if cfg[0] // (32 * cfg[1]) >= 8]


def print_kernel_table(rows, methods):
    print(f"{'shape':>11} {'dtype':>9} |" + "".join(f"{m:>16} |" for m in methods)
          + f"{'ceiling':>8} | ours/ceiling |" + "".join(f" x {m:<15}" for m in methods[1:]))
    for r in rows:
        print(f"{r['shape']:>11} {r['dtype']:>9} |"
              + "".join(f"{r[m + '_us']:>10.2f} us   |" for m in methods)
              + f"{r['ceiling_us']:>8.2f} | {r['ceiling_us'] / r['ours_us']:>12.1%} |"
              + "".join(f" {r[m + '_us'] / r['ours_us']:>16.3f}x" for m in methods[1:]))


def sweep(kernel, capability):
    """Kernel-only time of every SWEEP configuration, each passed explicitly and checked exact."""
    import bitsandbytes.functional as bnbf
    rows = []
    cases = []
    for out_features, in_features, dtype in helpers.KERNEL_SHAPES:
        layer = helpers.make_layer(out_features, in_features, dtype)
        layout = kernel.nf4_layout(layer.weight, layer.weight.quant_state)
        reference = bnbf.dequantize_4bit(layer.weight, layer.weight.quant_state)
        cases.append((f"{out_features}x{in_features}", layout, reference, torch.empty_like(reference)))
    for config in SWEEP:
        config = kernel.LaunchConfig(*config)
        row = {"config": list(config)}
        for name, layout, reference, out in cases:
            kernel.launch_nf4(layout, out, config, capability)
            assert torch.equal(out, reference), config
            row[name] = helpers.bench(lambda: kernel.launch_nf4(layout, out, config, capability)).median_us
        rows.append(row)
        print(row, flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true", help="time every launch configuration too")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the published procedure")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("benchmark.py needs a CUDA GPU (the notebook runs without one, in CPU mode)")

    kernel = helpers.load_kernel_cells()
    env = helpers.environment()
    methods = helpers.dequantizers(kernel)
    env["baselines"] = {
        "unsloth_fused": "unsloth.kernels.utils.fast_dequantize (default fused Triton path)",
        "unsloth_classic": "unsloth.kernels.utils._fast_dequantize_ctypes (bitsandbytes ctypes path)",
        "bnb": "bitsandbytes.functional.dequantize_4bit",
    }
    print({k: v for k, v in env.items() if k != "baselines"})
    print("methods:", list(methods))
    capability = torch.cuda.get_device_capability()
    tables = {"launch_configs": kernel.LAUNCH_CONFIGS.get(capability)}
    if args.sweep:
        tables["sweep"] = sweep(kernel, capability)
    rows = helpers.kernel_table(methods)
    tables["kernel"] = rows
    tables["device_copy_gbs"] = helpers.device_copy_gbs()
    tables["cpu_cost"] = helpers.cpu_cost_table(kernel)
    reference = methods.get("unsloth_fused", methods["bnb"])
    tables["procedure"] = helpers.procedure_table(methods, reference, repeats=args.repeats)

    print_kernel_table(rows, list(methods))
    print(f"device-to-device copy: {tables['device_copy_gbs']:.0f} GB/s; peak {env['peak_bandwidth_gbs']} GB/s")
    print("CPU cost per call (us):", {k: round(v, 2) for k, v in tables["cpu_cost"].items()})
    proc = tables["procedure"]
    for name, t in proc.items():
        ratio = t["median_s"] / proc["ours"]["median_s"]
        print(f"procedure {name:>16}: {t['median_s']:.4f} s (min {t['min_s']:.4f}, max {t['max_s']:.4f})"
              f"  ours is {ratio:.3f}x faster")
    name = "sweep.json" if args.sweep else "benchmark.json"
    path = helpers.write_results(helpers.results_dir(env) / name, env, **tables)
    print("wrote", path)


if __name__ == "__main__":
    main()
