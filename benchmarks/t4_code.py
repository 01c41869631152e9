"""The T4's code on this GPU: our kernel, unsloth's fused kernel and a plain copy kernel, each compiled
for sm_75 exactly as Triton's JIT would compile it for a T4, the PTX loaded here through the CUDA
driver's JIT, timed by this GPU's kernel-only clock. Not a T4 time: the same instructions on a GPU
with far more bandwidth per instruction. It shows how the T4's instruction streams compare, and that
they give bitsandbytes' bits.

    python -m benchmarks.t4_code              # T4_CANDIDATES, unsloth's sm_75 build and the copy kernel
                                              # at the four shapes: results/<gpu>/t4_code.json and .png
    python -m benchmarks.t4_code --wide       # the WIDE grid instead: t4_code_wide.json and .png
    python -m benchmarks.t4_code --recommend results/<gpu>/t4_code.json   # (no GPU) what a file says

How one sm_75 launch is made (Sm75Launch): the kernel is launched through Triton on this GPU, which
builds the JIT's kernel and its C launcher; the same source, specialization and options are compiled
for sm_75 and its PTX loaded through the driver; the JIT build's launcher (compiled.run) is then called as
the paste unit's plans call it (launcher_arguments), with the sm_75 function and launch metadata.
tests/test_t4_gpu.py runs the same on many layouts, bit for bit; tests/t4_static.py counts the
sm_75 SASS of each candidate.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

import torch
import triton
import triton.language as tl

import helpers
import timing
from benchmarks.cells import load_kernel_cells

T4 = (7, 5)  # the T4's compute capability
# The configurations a T4 may use: (weights_per_program, num_warps, lookup, evict_first). Each is built
# for sm_75 and timed here, checked bit for bit in tests/test_t4_gpu.py and counted by t4_static.py;
# LAUNCH_CONFIGS[(7, 5)] is one of them (--recommend). Why these: the WIDE grid's sm_75 builds on an
# H200 (results/nvidia-h200/t4_code_wide.json) ranked the gathered table ahead of the L1 table and
# evict-first ahead of none at every shape, 4 warps ahead of 8. Kept: the steadiest (4096 weights on
# 4 warps, gathered, evict-first), the fastest at the small shapes (2048) and at the large ones (8192
# on 4 warps, which spills in fp16: see results/t4-static), 8192 on 8 warps, and as controls the
# steadiest without evict-first and with the L1 table.
T4_CANDIDATES = timing.PICK_CANDIDATES[(7, 5)]  # (the pick on a T4 times the same ones)
# --wide: every work per thread from 8 to 64 weights on 4 or 8 warps, both lookups, both eviction settings
WIDE = tuple((w, warps, lookup, evict) for w in (1024, 2048, 4096, 8192) for warps in (4, 8)
             for lookup in (0, 1) for evict in (True, False) if 8 <= w // (32 * warps) <= 64)
# The copy kernel's sweep: (weights per program, warps, evict-first); its fastest is the ceiling.
COPY_SWEEP = tuple((w, warps, evict) for w, warps in ((2048, 4), (4096, 4), (4096, 8), (8192, 4), (8192, 8),
                                                      (16384, 8)) for evict in (True, False))
CALLS = 50  # timed calls per measurement
REGRET = 0.03  # the recommended entry may be this much slower than the fastest candidate at a shape
TITLE = "the T4's sm_75 instructions run on {gpu} through the driver's JIT: not a T4 time"
METHOD = ("Each kernel compiled for sm_75 with the specialization and options Triton's JIT gives it, the PTX "
          "loaded through the CUDA driver's JIT on this GPU and launched by the JIT build's own launcher "
          "(compiled.run) with the arguments Triton passes it (the paste unit's launcher_arguments; function and "
          f"launch metadata swapped). GPU time per call: {timing.GPU_TIME_METHOD}, median of {CALLS} calls. "
          "Every output is compared bit for bit with bitsandbytes.functional.dequantize_4bit.")


def t4_configs(kernel, candidates=T4_CANDIDATES) -> list:
    """The candidates as the kernel's LaunchConfig."""
    return [kernel.LaunchConfig(*candidate) for candidate in candidates]


# ---------------------------------------------------------------------------------------------
# The sm_75 build of a Triton launch, run on this GPU
# ---------------------------------------------------------------------------------------------
def _hashable(value):
    # compiled metadata comes back from JSON with lists where the options held tuples
    return tuple(map(_hashable, value)) if isinstance(value, list) else value


def options_for(target, metadata) -> dict:
    """The compile options of a JIT build (its metadata), for compiling the same source for another target:
    every option whose default is the same on both targets, as the JIT set it; the options whose defaults
    depend on the target (arch, fp8 types, ...) are left to the backend."""
    from triton.compiler.compiler import make_backend
    here = make_backend(metadata.target).parse_options({})
    there = make_backend(target).parse_options({})
    target_dependent = {name for name in vars(here) if getattr(here, name) != getattr(there, name)} | {"arch"}
    return {name: _hashable(getattr(metadata, name)) for name in vars(here)
            if name not in target_dependent and hasattr(metadata, name)}


class Sm75Build(NamedTuple):
    compiled: object   # triton's CompiledKernel for sm_75 (not loaded by Triton)
    function: int      # its PTX loaded through the driver's JIT on this GPU
    registers: int
    spills: int


_SM75_BUILDS: dict = {}  # the JIT build's hash -> its Sm75Build (one build per specialization)


def sm75_build(compiled) -> Sm75Build:
    """`compiled` (a JIT build for this GPU) compiled again for sm_75 with the same source, specialization
    and options, and its PTX loaded on this GPU through the driver's JIT."""
    if compiled.hash in _SM75_BUILDS:
        return _SM75_BUILDS[compiled.hash]
    from triton.backends.compiler import GPUTarget
    target = GPUTarget("cuda", 75, compiled.metadata.target.warp_size)
    options = options_for(target, compiled.metadata)
    sm75 = triton.compile(compiled.src, target=target, options=options)
    ptx = sm75.asm["ptx"]
    if ".target sm_75" not in ptx:
        raise RuntimeError("the PTX is not written for sm_75")
    for name, value in options.items():
        if _hashable(getattr(sm75.metadata, name)) != value:
            raise RuntimeError(f"compile option {name} differs between the JIT build and the sm_75 build")
    for name in ("global_scratch_size", "profile_scratch_size", "num_ctas", "launch_cooperative_grid", "launch_pdl"):
        # the JIT build's launcher allocates scratch and sets these: the sm_75 build must need the same
        if hasattr(compiled.metadata, name) and getattr(sm75.metadata, name) != getattr(compiled.metadata, name):
            raise RuntimeError(f"{name} differs between the JIT build and the sm_75 build")
    driver = triton.runtime.driver.active
    # null-terminated PTX where a cubin would go: the driver compiles it for this GPU
    loaded = driver.utils.load_binary(sm75.name, ptx.encode() + b"\0", sm75.metadata.shared,
                                      driver.get_current_device())
    _SM75_BUILDS[compiled.hash] = Sm75Build(sm75, loaded[1], loaded[2], loaded[3])
    return _SM75_BUILDS[compiled.hash]


class Sm75Launch:
    """One Triton launch, jit_function[grid](*args, **constexprs, **options), with its sm_75 build in place of
    the JIT's. Making it launches the JIT's build (into `out`, one of args); `into(out)` then calls the JIT
    build's launcher as the paste unit's plans do (launcher_arguments), with the sm_75 function and launch
    metadata in place of the JIT build's, into another output."""

    def __init__(self, kernel, jit_function, grid, args, constexprs, options, out):
        self.jit_compiled = jit_function[grid](*args, **constexprs, **options)
        self.build = sm75_build(self.jit_compiled)
        self.grid = (*grid, 1, 1)[:3]
        before, after = kernel.launcher_arguments(jit_function, args, _with_defaults(jit_function, constexprs))
        # launcher_arguments leaves out args[-2], where our kernel takes its output: put back what is there
        left_out = args[-2].data_ptr() if isinstance(args[-2], torch.Tensor) else args[-2]
        self.arguments = [*before, left_out, *after]
        self.output = [argument is out for argument in args].index(True)

    def into(self, out):
        arguments = list(self.arguments)
        arguments[self.output] = out.data_ptr()
        stream = triton.runtime.driver.active.get_current_stream(out.device.index)  # as Triton's launch asks
        self.jit_compiled.run(*self.grid, stream, self.build.function, self.build.compiled.packed_metadata,
                              None, None, None, *arguments)

    def facts(self) -> dict:
        sm75 = self.build.compiled
        return {"registers": self.build.registers, "spills": self.build.spills, "shared_bytes": sm75.metadata.shared,
                "num_warps": sm75.metadata.num_warps, "ptx_bytes": len(sm75.asm["ptx"]),
                "jit_target": self.jit_compiled.metadata.target.arch}


def _with_defaults(jit_function, constexprs: dict) -> dict:
    """constexprs with the defaults of the kernel's parameters it leaves out (launcher_arguments names them all)."""
    defaults = {param.name: param.default for param in jit_function.params if param.has_default}
    return {**defaults, **constexprs}


def ours(kernel, layout, out, config, hand_bf16=False) -> Sm75Launch:
    """Our kernel with `config` and the T4's constexprs (capability 7.5: Triton's own bf16 cast, or with
    hand_bf16 the kernel's own rounding, what the T4 build ran before)."""
    grid, args, constexprs, options = kernel.launch_arguments(layout, out, config, T4)
    if hand_bf16:
        constexprs["BF16_RNE"] = True
    return Sm75Launch(kernel, kernel._dequantize_4bit_kernel, grid, args, constexprs, options, out)


def unsloth_launch(kernel, utils, nf4, W, quant_state, out) -> tuple[Sm75Launch, dict, dict]:
    """unsloth's fused kernel as its eager dequantize_nf4 launches it for a GPU of capability 7.5 (its own
    configuration table and choice), with the constexprs and options it picked: its launch helper is replaced
    by a recorder and its capability lookup answers (7, 5) for the one call (utils, nf4: unsloth.kernels')."""
    absmax, shape, dtype, blocksize, code, code2, absmax2, offset, blocksize2 = utils._unpack_quant_state(quant_state)
    seen = []

    def capture(jit_function, grid, args, n_tensors, constexprs, device_index, **options):
        seen.append((jit_function, grid, args, constexprs, options))

    def capability(index):
        return T4

    launch, lookup = nf4.launch, nf4._capability
    nf4.launch, nf4._capability = capture, capability
    try:
        nf4.dequantize_nf4(W, absmax, code2, absmax2, offset, code, blocksize, blocksize2, shape, dtype, out=out)
    finally:
        nf4.launch, nf4._capability = launch, lookup
    if len(seen) != 1:
        raise RuntimeError(f"unsloth's dequantize_nf4 launched {len(seen)} times")
    jit_function, grid, args, constexprs, options = seen[0]
    return Sm75Launch(kernel, jit_function, grid, args, constexprs, options, out), constexprs, options


def unsloth_config(constexprs, options, blocksize) -> dict:
    rows = constexprs["ROWS"]
    return {"rows": rows, "weights_per_program": rows * blocksize, "packed_bytes_per_program": rows * blocksize // 2,
            "num_warps": options["num_warps"], "int32_loads": bool(constexprs["WORDS"]),
            "evict": constexprs["EVICT"] or "none", "lut_mode": constexprs["LUT_MODE"],
            "enable_fp_fusion": options.get("enable_fp_fusion")}


@triton.jit
def _copy_kernel(
    packed_ptr,   # uint8: the packed weight's bytes, HALF per absmax block
    absmax_ptr,   # uint8: one absmax code per block
    out_ptr,      # int16 [2 * bytes]: two 16-bit values per packed byte
    ROWS: tl.constexpr,    # absmax blocks per program
    HALF: tl.constexpr,    # packed bytes per block
    STREAM: tl.constexpr,  # evict-first hints
):
    # A dequantization's traffic with no decoding: each byte and its block's absmax code read once,
    # two 16-bit values written per byte (the byte in the low half, the code in the high half, so
    # neither load can be dropped). Whole tiles only: the shapes here are.
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    hint: tl.constexpr = "evict_first" if STREAM else ""
    packed = tl.load(packed_ptr + rows[:, None] * HALF + tl.arange(0, HALF)[None, :], eviction_policy=hint)
    absmax = tl.load(absmax_ptr + rows)
    word = packed.to(tl.int16) | (absmax.to(tl.int16) << 8)[:, None]
    tl.store(out_ptr + rows[:, None] * (2 * HALF) + tl.arange(0, 2 * HALF)[None, :], tl.interleave(word, word),
             eviction_policy=hint)


def copy_launch(kernel, packed, absmax, out, weights_per_program, num_warps, evict_first, blocksize=64):
    rows = weights_per_program // blocksize
    if absmax.numel() % rows:
        raise ValueError(f"{absmax.numel()} blocks are not whole tiles of {rows}")
    return Sm75Launch(kernel, _copy_kernel, (absmax.numel() // rows,), (packed, absmax, out),
                      dict(ROWS=rows, HALF=blocksize // 2, STREAM=evict_first), dict(num_warps=num_warps), out)


def copy_expected(packed, absmax, blocksize=64) -> torch.Tensor:
    """What the copy kernel writes, as int16."""
    word = packed.view(torch.uint8).reshape(-1, blocksize // 2).to(torch.int32) | (absmax.to(torch.int32) << 8)[:, None]
    word = torch.where(word >= 2**15, word - 2**16, word).to(torch.int16).reshape(-1)
    return torch.stack((word, word), dim=1).reshape(-1)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def timed_and_checked(launch: Sm75Launch, expected: torch.Tensor, flush) -> dict:
    """GPU time of the sm_75 launch into an output filled with 0xFF bytes first, and whether it then holds
    the expected bits."""
    out = torch.empty_like(expected)
    out.view(torch.uint8).fill_(0xFF)
    measured = timing.gpu_time(lambda: launch.into(out), calls=CALLS, flush=flush)
    torch.cuda.synchronize()
    return {"median_us": round(measured.median_us, 3), "p20_us": round(measured.p20_us, 3),
            "p80_us": round(measured.p80_us, 3), "sm75_bit_exact": torch.equal(_bits(out), _bits(expected))}


# ---------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------
def measure_shape(kernel, utils, nf4, out_features, in_features, dtype, configs, flush) -> dict:
    import bitsandbytes.functional as bnbf
    layer = helpers.make_layer(out_features, in_features, dtype)
    W, qs = layer.weight, layer.weight.quant_state
    reference = bnbf.dequantize_4bit(W, qs)
    layout = kernel.validate(W, qs)
    row = {"shape": f"{out_features}x{in_features}", "dtype": helpers.short_dtype(dtype), "weights": reference.numel(),
           "bytes_moved": helpers.bytes_moved(reference.numel(), dtype), "ours": {}}
    label = f"  {row['shape']} {row['dtype']}"
    for config in configs:
        out = torch.empty_like(reference)
        launch = ours(kernel, layout, out, config)
        entry = timed_and_checked(launch, reference, flush)
        row["ours"][str(list(config))] = {"config": list(config), "jit_build_bit_exact": torch.equal(out, reference),
                                          **entry, **launch.facts()}
        print(f"{label} ours {timing.describe_config(config):<40} {entry['median_us']:9.2f} us", flush=True)
    if dtype == torch.bfloat16:  # the first candidate with the kernel's hand rounding to bf16
        launch = ours(kernel, layout, torch.empty_like(reference), configs[0], hand_bf16=True)
        row["hand_bf16_rounding"] = {"config": list(configs[0]), **timed_and_checked(launch, reference, flush)}
    if nf4 is not None:  # unsloth's fused kernel, with the configuration it picks for capability 7.5
        out = torch.empty_like(reference)
        launch, constexprs, options = unsloth_launch(kernel, utils, nf4, W, qs, out)
        entry = timed_and_checked(launch, reference, flush)
        row["unsloth"] = {"config": unsloth_config(constexprs, options, qs.blocksize),
                          "jit_build_bit_exact": torch.equal(out, reference), **entry, **launch.facts()}
        print(f"{label} unsloth sm_75 {entry['median_us']:9.2f} us", flush=True)
    expected, sweep = copy_expected(layout.packed, layout.absmax, qs.blocksize), []
    for weights, warps, evict in COPY_SWEEP:  # its fastest is the ceiling
        out = torch.empty_like(expected)
        entry = timed_and_checked(copy_launch(kernel, layout.packed, layout.absmax, out, weights, warps, evict),
                                  expected, flush)
        if not entry["sm75_bit_exact"]:
            raise RuntimeError(f"the copy kernel ({weights}, {warps}, {evict}) wrote something else")
        sweep.append({"weights_per_program": weights, "num_warps": warps, "evict_first": evict, **entry})
    row["copy"] = {**min(sweep, key=lambda entry: entry["median_us"]), "sweep": sweep}
    print(f"{label} copy kernel {row['copy']['median_us']:9.2f} us", flush=True)
    for entry in row["ours"].values():
        entry["vs_unsloth"] = round(row["unsloth"]["median_us"] / entry["median_us"], 4) if nf4 else None
        entry["of_copy_speed"] = round(row["copy"]["median_us"] / entry["median_us"], 4)
    return row


def run(candidates, name: str) -> dict:
    kernel = load_kernel_cells()
    utils = helpers.import_unsloth_kernels()
    nf4 = sys.modules.get("unsloth.kernels.nf4") if utils is not None else None
    env = helpers.environment(vars(kernel))
    configs, flush = t4_configs(kernel, candidates), timing.l2_flush()
    print(TITLE.format(gpu=env["gpu"]), flush=True)
    shapes = [measure_shape(kernel, utils, nf4, *shape, configs, flush) for shape in helpers.KERNEL_SHAPES]
    results = {"what": TITLE.format(gpu=env["gpu"]), "method": METHOD, "candidates": [list(c) for c in configs],
               "unsloth_t4_config_rule": unsloth_rule() if nf4 else "unsloth not installed", "shapes": shapes}
    results["recommendation"] = recommend(results)
    directory = helpers.results_dir(env)
    print("wrote", helpers.write_results(directory / f"{name}.json", env, measurement={name: METHOD}, **results))
    results["environment"] = env
    plot(results, directory / f"{name}.png")
    return results


def unsloth_rule() -> str:
    newer = tuple(int(part) for part in triton.__version__.split(".")[:2]) >= (3, 7)
    entry = ("its (7, 5) entry (512 bytes a program, 8 warps, int32 loads, evict-first)" if newer else
             "its default table (its (7, 5) entry exists on Triton >= 3.7 only)")
    return ("unsloth.kernels.nf4's own eager dequantize_nf4, its capability lookup answering (7, 5): on Triton "
            f"{triton.__version__} that is {entry}")


# ---------------------------------------------------------------------------------------------
# Reading the results: recommendation, plot
# ---------------------------------------------------------------------------------------------
def recommend(results: dict) -> dict:
    """Per shape the fastest exact candidate; the LAUNCH_CONFIGS[(7, 5)] entry: the exact candidate whose worst
    slowdown against the fastest at any shape is least (within REGRET, or said not to be); the candidates that
    lose to unsloth's sm_75 build at every shape, and those not bit-exact somewhere."""
    shapes = sorted(results["shapes"], key=lambda shape: shape["weights"])
    keys = list(shapes[0]["ours"])
    exact = [key for key in keys if all(shape["ours"][key]["sm75_bit_exact"] for shape in shapes)]
    best = {shape["shape"]: min(exact, key=lambda key: shape["ours"][key]["median_us"]) for shape in shapes}

    def slowdown(key, shape):
        return shape["ours"][key]["median_us"] / shape["ours"][best[shape["shape"]]]["median_us"] - 1

    worst = {key: max(slowdown(key, shape) for shape in shapes) for key in exact}
    pick = min(worst, key=worst.get)
    losers = [key for key in keys if all("unsloth" in shape and shape["ours"][key]["median_us"] >=
                                         shape["unsloth"]["median_us"] for shape in shapes)]
    geomean = {key: math.exp(statistics.fmean(math.log(shape["ours"][key]["vs_unsloth"]) for shape in shapes))
               for key in keys if all(shape["ours"][key].get("vs_unsloth") for shape in shapes)}
    return {"per_shape_best": {shape["shape"]: {field: shape["ours"][best[shape["shape"]]][field] for field in
                                                ("config", "median_us", "vs_unsloth", "of_copy_speed")}
                               for shape in shapes},
            "worst_slowdown_per_candidate": {key: round(value, 4) for key, value in worst.items()},
            "geomean_vs_unsloth_per_candidate": {key: round(value, 4) for key, value in geomean.items()},
            "launch_configs_t4": shapes[0]["ours"][pick]["config"], "worst_slowdown_of_entry": round(worst[pick], 4),
            "why": f"at most {worst[pick]:.1%} slower than the fastest candidate at any shape"
                   + ("" if worst[pick] <= REGRET else f" (none is within {REGRET:.0%} everywhere)"),
            "lose_to_unsloth_everywhere": [shapes[0]["ours"][key]["config"] for key in losers],
            "not_exact": [key for key in keys if key not in exact]}


def recommendation_text(results: dict) -> str:
    rec = results.get("recommendation") or recommend(results)
    lines = ["per shape, the fastest candidate (sm_75 build):"]
    for shape, best in rec["per_shape_best"].items():
        versus = f", {best['vs_unsloth']:.2f}x unsloth's sm_75" if best["vs_unsloth"] else ""
        best_config = timing.describe_config(best['config'])
        lines.append(f"  {shape:>11}: {best_config}: {best['median_us']:.2f} us{versus}, "
                     f"{best['of_copy_speed']:.0%} of the copy kernel's speed")
    lines.append(f"proposed LAUNCH_CONFIGS[(7, 5)]: LaunchConfig{tuple(rec['launch_configs_t4'][:4])} ({rec['why']})")
    if rec["lose_to_unsloth_everywhere"]:
        lines.append("slower than unsloth's sm_75 build at every shape (drop): "
                     + "; ".join(timing.describe_config(config) for config in rec["lose_to_unsloth_everywhere"]))
    if rec["not_exact"]:
        lines.append("NOT bit-exact somewhere (never use): " + "; ".join(rec["not_exact"]))
    return "\n".join(lines)


def plot(results: dict, path: Path):
    """Above: effective bandwidth (bytes moved / GPU time) of the copy kernel, unsloth's and our fastest sm_75
    build per shape; below: unsloth's sm_75 time / ours, per candidate and shape (a labelled heatmap)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    env, shapes = results["environment"], results["shapes"]
    labels = [f"{shape['shape']}\n{shape['dtype']}" for shape in shapes]
    x, keys = list(range(len(shapes))), list(shapes[0]["ours"])
    with_unsloth = all("unsloth" in shape for shape in shapes)
    # one above the other, 9 inches wide at 100 dpi, text 9 pt or more: read at its own size on GitHub and Colab
    fig, (upper, lower) = plt.subplots(2, 1, figsize=(9, 4.6 + 0.26 * len(keys)), layout="constrained",
                                       gridspec_kw={"height_ratios": (3.4, 1.2 + 0.26 * len(keys))})
    rec = results.get("recommendation") or recommend(results)
    series = [("copy kernel (same bytes, no math)", [shape["copy"]["median_us"] for shape in shapes], "0.6")]
    if with_unsloth:
        series.append(("unsloth fused, its choice for 7.5", [shape["unsloth"]["median_us"] for shape in shapes],
                       "tab:orange"))
    series.append(("ours, fastest candidate", [shape["ours"][str(rec["per_shape_best"][shape["shape"]]["config"])]
                                               ["median_us"] for shape in shapes], "tab:blue"))
    width, top = 0.8 / len(series), 0
    for i, (name, times, color) in enumerate(series):
        values = [shape["bytes_moved"] / us / 1e3 for shape, us in zip(shapes, times)]
        top = max(top, *values)
        upper.bar([xi + (i - (len(series) - 1) / 2) * width for xi in x], values, width, label=name, color=color)
    upper.set_ylim(0, top * 1.3)
    upper.set_xticks(x, labels)
    upper.set_ylabel("GB/s (bytes moved / GPU time)")
    upper.set_title("sm_75 builds: effective bandwidth", fontsize=10)
    upper.legend(fontsize=9, loc="upper left", ncol=2)
    if with_unsloth:
        ratios = [[shape["ours"][key]["vs_unsloth"] for shape in shapes] for key in keys]
        spread = max(abs(r - 1) for row in ratios for r in row) or 0.1
        # the colour scale reaches past the data, so that every cell stays light enough for dark text
        image = lower.imshow(ratios, cmap="RdBu", vmin=1 - 1.6 * spread, vmax=1 + 1.6 * spread, aspect="auto")
        for row, values in enumerate(ratios):
            for col, value in enumerate(values):
                lower.text(col, row, f"{value:.2f}x", ha="center", va="center", fontsize=9,
                           fontweight="bold" if value >= 1.15 else "normal", color="black")
        lower.set_xticks(x, labels)
        labels = [timing.describe_config(shapes[0]["ours"][key]["config"]) for key in keys]
        lower.set_yticks(range(len(keys)), labels, fontsize=9)
        lower.set_title("unsloth's sm_75 time / ours, per candidate (bold: 1.15x or more)", fontsize=10)
        fig.colorbar(image, ax=lower, fraction=0.04).set_label("unsloth's sm_75 time / ours", fontsize=9)
    fig.suptitle(TITLE.format(gpu=env["gpu"]) + f"\n{helpers.versions_line(env, date=False)}", fontsize=11)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wide", action="store_true", help="time the WIDE grid instead of T4_CANDIDATES")
    parser.add_argument("--recommend", metavar="RESULTS", help="print what a results file recommends and stop")
    args = parser.parse_args(argv)
    if args.recommend:
        print(recommendation_text(json.loads(Path(args.recommend).read_text())))
        return
    if not torch.cuda.is_available():
        sys.exit("benchmarks.t4_code runs the sm_75 builds on a CUDA GPU (--recommend runs anywhere)")
    results = run(WIDE if args.wide else T4_CANDIDATES, "t4_code_wide" if args.wide else "t4_code")
    print(recommendation_text(results))


if __name__ == "__main__":
    main()
